"""SGLang over two CUDA GPUs: weights through the ``sglang-distributed`` transport from a trainer on
the other GPU (split placement: NCCL straight into SGLang's scheduler), and a tensor-parallel engine
(``tensor_parallel_size=2``) that re-shards the Hugging Face-named stream itself, under rlcore's
rollout contract suite. Each engine lives for one test class (SGLang's shutdown ends every child
process of this one, so two never overlap). Skipped without two GPUs or sglang (CI); run on the lent
2-GPU machine (``python -m benchmarks.gpu sglang-tests-multi``), results in benchmarks/results/sglang/.
"""

import importlib.util
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from rlcore.api import RolloutSpec, SamplingParams
from rlcore.devices import get_platform
from rlcore.testing.contract import RolloutEngineContract
from rlcore.transports.config import TransportConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
    pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="needs sglang (CUDA machines)"),
]

# The single-GPU module's model, trainer (rlcore's FSDP engine on GPU 0, trained away from the start
# weights), probes and tolerance: the same post-sync check, other placements.
_spec = importlib.util.spec_from_file_location(
    "sglang_gpu_tests", Path(__file__).with_name("test_engine_gpu.py")
)
one_gpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(one_gpu)
model_path, start_weights, trainer = one_gpu.model_path, one_gpu.start_weights, one_gpu.trainer
BUCKET = 512 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build(model_path, tensor_parallel_size=1, **engine_kwargs):
    from rlcore_sglang.config import SGLangConfig
    from rlcore_sglang.engine import SGLangRollout

    spec = RolloutSpec(
        model_path=str(model_path),
        dtype="bfloat16",
        tensor_parallel_size=tensor_parallel_size,
        max_model_len=1024,
        seed=0,
    )
    config = SGLangConfig(mem_fraction_static=0.3, engine_kwargs=engine_kwargs)
    return SGLangRollout(spec, config, get_platform("cuda"))


class TestSplitPlacement:
    """SGLang on GPU 1, the trainer on GPU 0: weights over SGLang's own NCCL group."""

    @pytest.fixture(scope="class")
    def engine(self, model_path):
        rollout = build(model_path, base_gpu_id=1)
        yield rollout
        rollout.shutdown()

    @pytest.fixture(scope="class")
    def link(self, engine):
        """``(sender, receiver)``: the transport's two ends, joined (the sender on a thread, as the
        trainer's process would run it beside this rollout worker's)."""
        from rlcore_sglang.transport import SGLangDistributedTransport

        config = TransportConfig(name="sglang-distributed", bucket_bytes=BUCKET, timeout_s=300)
        sender = SGLangDistributedTransport(config, get_platform("cuda"))
        receiver = SGLangDistributedTransport(config, get_platform("cuda"))
        receiver.attach(engine)
        port = free_port()
        with ThreadPoolExecutor(1) as pool:
            joined = pool.submit(sender.init_group, 0, 2, "127.0.0.1", port)
            receiver.init_group(1, 2, "127.0.0.1", port)
            joined.result()
        yield sender, receiver
        sender.close()

    @staticmethod
    def sync(link, engine, buckets) -> float:
        sender, receiver = link
        start = time.perf_counter()
        pool = ThreadPoolExecutor(1)
        sent = pool.submit(sender.send, buckets)
        try:
            receiver.load_into(engine, None)
        except BaseException:
            pool.shutdown(wait=False)  # a sender stuck in a broadcast that SGLang left must not hang the test
            raise
        sent.result(timeout=120)
        pool.shutdown()
        return time.perf_counter() - start

    def test_trainer_weights_reach_sglang_over_its_nccl_group(self, engine, link, trainer):
        probe = one_gpu.prompts()
        stale = one_gpu.sync_gap(engine, trainer, probe)
        seconds = [self.sync(link, engine, trainer.export_weights(torch.bfloat16, BUCKET)) for _ in range(3)]
        synced = one_gpu.sync_gap(engine, trainer, probe)
        sender = link[0]
        print(
            f"\nsglang-distributed: {sender.last_stats['sync/bytes'] / 2**30:.3f} GiB in "
            f"{sender.last_stats['sync/buckets']:.0f} buckets, sync seconds {[round(s, 4) for s in seconds]}; "
            f"post-sync check before {stale}, after {synced}"
        )
        assert synced["sync/logprob_diff_mean"] < one_gpu.BF16_MEAN_GAP
        assert stale["sync/logprob_diff_mean"] > 10 * synced["sync/logprob_diff_mean"], "the trainer moved"

    def test_a_bad_tensor_stops_the_sync_and_the_engine_stays_usable(self, engine, link, start_weights):
        from rlcore_sglang.weight_stream import WeightStreamError

        params = SamplingParams(temperature=0.0, max_tokens=8)
        self.sync(link, engine, [start_weights])
        before = engine.generate(one_gpu.prompts(2), params)
        bad = [("model.layers.0.mlp.down_prj.weight", start_weights[0][1].cuda())]
        with pytest.raises(WeightStreamError, match="down_prj"):
            self.sync(link, engine, [[(n, t.cuda()) for n, t in start_weights[:3]], bad])
        self.sync(link, engine, [start_weights])  # the group is still in step
        assert [c[0].token_ids for c in engine.generate(one_gpu.prompts(2), params)] == [
            c[0].token_ids for c in before
        ]


class TestTensorParallel(RolloutEngineContract):
    """One engine over both GPUs (``tp_size=2``): the contract suite, and the trainer's full tensors
    re-sharded by SGLang's loaders."""

    logprob_atol = 1e-3

    @pytest.fixture(scope="class")
    def tp_engine(self, model_path):
        rollout = build(model_path, tensor_parallel_size=2)
        yield rollout
        rollout.shutdown()

    @pytest.fixture
    def rollout_engine(self, tp_engine):
        return tp_engine

    @pytest.fixture
    def rollout_weights(self, start_weights):
        return start_weights

    def test_trainer_sync_is_resharded_by_sglang(self, tp_engine, trainer, start_weights):
        from rlcore.weights import bucketize

        probe = one_gpu.prompts()
        tp_engine.load_weights(bucketize(start_weights, 8 << 20))
        stale = one_gpu.sync_gap(tp_engine, trainer, probe)
        start = time.perf_counter()
        tp_engine.load_weights(trainer.export_weights(torch.bfloat16, BUCKET))
        seconds = time.perf_counter() - start
        synced = one_gpu.sync_gap(tp_engine, trainer, probe)
        print(
            f"\nsglang tp_size=2: colocated sync {seconds:.4f} s; post-sync check before {stale}, after {synced}"
        )
        assert synced["sync/logprob_diff_mean"] < one_gpu.BF16_MEAN_GAP
        assert stale["sync/logprob_diff_mean"] > 10 * synced["sync/logprob_diff_mean"], "the trainer moved"

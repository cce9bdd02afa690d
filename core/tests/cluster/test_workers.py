"""Workers in-process: the wire format batches cross Ray in, failure wrapping, and transport configs."""

import os
import pickle

import pytest
import torch
from rlcore.api import Batch, EngineSpec, LoraSpec, RolloutSpec, SamplingParams
from rlcore.cluster import RolloutWorker, TrainWorker, WorkerError
from rlcore.cluster.wire import WireBatch
from rlcore.cluster.workers import transport_config_for
from rlcore.config.schema import TransportConfig as RunTransportConfig
from rlcore.testing.contract import contract_batch, token_nll_loss
from rlcore.testing.fakes import FakeTrainConfig
from rlcore.transports import TransportConfig


def out_of_band_round_trip(value):
    """Pickle as Ray does: protocol 5, large buffers passed out of band (then read-only, as Ray's)."""
    buffers = []
    data = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    frozen = [memoryview(bytes(b.raw())) for b in buffers]  # bytes: immutable, like the object store
    return pickle.loads(data, buffers=frozen), len(buffers)


def test_batches_cross_as_raw_bytes_and_arrive_in_owned_memory():
    base = torch.randn(4, 6, dtype=torch.float64)
    batch = Batch(
        {
            "bf16": torch.randn(4, 3).to(torch.bfloat16),
            "mask": torch.tensor([True, False, True, True]),
            "strided": base[:, ::2],  # not contiguous
            "ids": torch.arange(8).view(4, 2),
        },
        {"uid": ["a", "b", "c", "d"]},
        {"global_tokens": 7},
    )
    got, buffers = out_of_band_round_trip(WireBatch(batch))
    assert isinstance(got, Batch) and buffers == 4  # every tensor out of band, none pickled in-band
    for key, tensor in batch.tensors.items():
        assert got[key].dtype == tensor.dtype and torch.equal(got[key], tensor), key
    assert got["uid"] == ["a", "b", "c", "d"] and got.meta == {"global_tokens": 7}
    got["ids"].add_(1)  # writable, and its own memory: engines may modify batches in place
    assert batch["ids"][0, 0] == 0


def test_a_failing_method_names_role_rank_and_phase():
    worker = TrainWorker("critic", "fake", EngineSpec(model_path="", head="value"), device="cpu")
    assert worker.topology() == (0, 1, True)
    with pytest.raises(WorkerError) as info:
        worker.call("infer", contract_batch(2, vocab_low=1, vocab_high=50), ("log_probs",))
    assert (info.value.role, info.value.rank, info.value.phase) == ("critic", 0, "infer")
    # The engine and the plugin it came from (a third party's engine says whose it is).
    source = "engine 'fake' from plugin 'rlcore.testing.plugin' (rlcore 0.1.0)"
    assert info.value.source == source
    assert f"critic rank 0 ({source}) failed in infer: ValueError: FakeTrainEngine with head 'value'" in str(
        info.value
    )


def test_an_unknown_engine_fails_while_the_worker_is_built():
    with pytest.raises(
        WorkerError, match=r"actor rank 0 failed in __init__: RegistryError: unknown train engine 'nope'"
    ):
        TrainWorker("actor", "nope", EngineSpec(model_path=""), device="cpu")


def test_a_lora_spec_is_refused_by_an_engine_that_trains_no_adapters():
    spec = EngineSpec(model_path="", lora=LoraSpec(rank=4))
    with pytest.raises(WorkerError, match=r"actor\.lora\.rank=4: train engine 'fake'.*does not train LoRA"):
        TrainWorker("actor", "fake", spec, device="cpu")


def test_engine_config_defaults_to_the_registered_config_class():
    worker = TrainWorker("actor", "fake", EngineSpec(model_path=""), device="cpu")
    assert worker.engine.config == FakeTrainConfig()
    metrics = worker.call("train_step", contract_batch(4, vocab_low=1, vocab_high=50), token_nll_loss)
    assert {"loss", "grad_norm", "lr"} <= set(metrics) and worker.last_timings()["train_step"] > 0
    info = worker.ping()
    assert (
        info["pid"] == os.getpid()
        and info["node_id"] is None
        and (info["role"], info["rank"]) == ("actor", 0)
    )


def test_rollout_worker_generates_as_its_replica():
    worker = RolloutWorker("fake", RolloutSpec(model_path=""), device="cpu", replica=2, num_replicas=3)
    assert worker.topology() == (2, 3, True)
    out = worker.call("generate", [[1, 2]], SamplingParams(n=2, max_tokens=3))
    assert [len(c.token_ids) for c in out[0]] == [3, 3]
    with pytest.raises(
        WorkerError, match=r"rollout rank 2 \(engine 'fake' from plugin .*\) failed in release: ValueError"
    ):
        worker.release(["optimizer"])


def test_transport_config_comes_from_either_config_class():
    run = RunTransportConfig(name="auto", bucket_bytes=1234)
    config = transport_config_for("ray", run)
    assert isinstance(config, TransportConfig) and (config.name, config.bucket_bytes) == ("ray", 1234)
    own = TransportConfig(name="broadcast", timeout_s=5)
    assert transport_config_for("broadcast", own) is own
    assert transport_config_for("inprocess", None) == TransportConfig(name="inprocess")


class EngineEndTransport:
    """A collective transport whose receiving end is the engine itself (as ``sglang-distributed``): it
    takes one rank per device of the engine (``tensor_parallel_size``) and loads it in place."""

    def __init__(self, config=None, platform=None):
        self.engine, self.calls = None, []

    def attach(self, engine):
        self.engine = engine

    def receiver_ranks(self):
        return self.engine.spec.tensor_parallel_size

    def init_group(self, rank, world_size, master_addr, master_port):
        self.calls.append(("init_group", rank, world_size))

    def send(self, buckets):
        raise AssertionError("not a sender here")

    def receive(self, handle):
        raise AssertionError("the worker must not receive in its own process")

    def load_into(self, engine, handle):
        self.calls.append(("load_into", engine is self.engine, handle))
        self.last_receive_stats = {"sync/receive_bytes": 12.0}


def test_a_transport_can_make_the_engine_its_receiving_end():
    from rlcore.plugins import registry, reset_plugins

    registry("weight_transports").register("test/engine-end", EngineEndTransport, plugin="test-plugin")
    try:
        worker = RolloutWorker(
            "fake", RolloutSpec(model_path="", tensor_parallel_size=3), device="cpu", replica=1
        )
        config = TransportConfig(name="test/engine-end")
        assert worker.weight_group_ranks("test/engine-end", config) == 3
        worker.join_weight_group("test/engine-end", config, 7, "127.0.0.1", 1234, [1, 4])
        stats = worker.receive_weights("test/engine-end", config, "handle-0")
        calls = worker._transport("test/engine-end", config).calls
    finally:
        reset_plugins()
    assert calls == [("init_group", 4, 7), ("load_into", True, "handle-0")]  # replica 1's first rank: 4
    assert stats["sync/receive_bytes"] == 12.0 and stats["sync/load_seconds"] >= 0

"""Probe of the ``sglang-distributed`` weight transport on a 2-GPU machine: the sender (this process,
GPU 0) broadcasts a model's weights into an SGLang engine whose scheduler runs on GPU 1, in one variant
of the environment per run (each in a fresh process, so NCCL reads its environment anew):

    python benchmarks/gpu/sglang_dist_probe.py MODEL_DIR VARIANT      # saver-on | saver-off | cumem-on

Prints the sync seconds and the post-sync weights check (``get_weights_by_name``), or the error.
"""

import os
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor

VARIANT = sys.argv[2]
if VARIANT == "cumem-on":
    os.environ["NCCL_CUMEM_ENABLE"] = "1"  # SGLang sets 0 unless it is set
os.environ.setdefault("NCCL_DEBUG", "WARN")

import torch  # noqa: E402
from rlcore.api import RolloutSpec  # noqa: E402
from rlcore.devices import get_platform  # noqa: E402
from rlcore.transports.config import TransportConfig  # noqa: E402
from rlcore_sglang.config import SGLangConfig  # noqa: E402
from rlcore_sglang.engine import SGLangRollout  # noqa: E402
from rlcore_sglang.transport import SGLangDistributedTransport  # noqa: E402
from safetensors.torch import load_file  # noqa: E402


def main(model: str) -> None:
    spec = RolloutSpec(model_path=model, dtype="bfloat16", max_model_len=1024, seed=0)
    config = SGLangConfig(
        mem_fraction_static=0.3,
        disable_cuda_graph=VARIANT != "graphs-on",
        enable_memory_saver=VARIANT != "saver-off",
        engine_kwargs={"base_gpu_id": 1},
    )
    engine = SGLangRollout(spec, config, get_platform("cuda"))
    tensors = {}
    for name in sorted(os.listdir(model)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(model, name)))
    weights = [(n, (t.to(torch.bfloat16) * 0.5).cuda()) for n, t in sorted(tensors.items())]
    transport = TransportConfig(name="sglang-distributed", bucket_bytes=512 << 20, timeout_s=60)
    sender = SGLangDistributedTransport(transport, get_platform("cuda"))
    receiver = SGLangDistributedTransport(transport, get_platform("cuda"))
    receiver.attach(engine)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pool = ThreadPoolExecutor(1)
    joined = pool.submit(sender.init_group, 0, 2, "127.0.0.1", port)
    receiver.init_group(1, 2, "127.0.0.1", port)
    joined.result(timeout=60)
    print(f"{VARIANT}: joined", flush=True)
    for i in range(3):
        start = time.perf_counter()
        sent = pool.submit(sender.send, [weights])
        receiver.load_into(engine, None)
        sent.result(timeout=60)
        print(f"{VARIANT}: sync {i} {time.perf_counter() - start:.4f} s, {sender.last_stats}", flush=True)
    name = "model.layers.0.mlp.down_proj.weight"
    with engine.exclusive() as raw:
        from sglang.srt.managers.io_struct import GetWeightsByNameReqInput

        got = engine.run_on_engine_loop(
            lambda: raw.tokenizer_manager.get_weights_by_name(
                GetWeightsByNameReqInput(name=name, truncate_size=8), None
            )
        )
    expected = dict(weights)[name][0, :8].float().cpu()
    print(
        f"{VARIANT}: check {name}[0,:8] loaded={got[0][:8] if got else got} expected={expected.tolist()}",
        flush=True,
    )
    os._exit(0)  # the pool thread and SGLang's processes: no orderly shutdown needed for a probe


if __name__ == "__main__":
    main(sys.argv[1])

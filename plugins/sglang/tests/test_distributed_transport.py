"""The ``sglang-distributed`` weight transport over gloo: the sender (a trainer rank) here, two SGLang
rollout workers as processes (``scheduler_worker.py``: the plugin's engine and transport code over a
stand-in for SGLang's scheduler that receives as SGLang 0.5.16 does). Loaded weights are checked
against the float64 reference they were made from."""

import importlib.util
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rlcore.devices import get_platform
from rlcore.transports.config import TransportConfig
from rlcore_sglang.transport import SGLangDistributedTransport
from rlcore_sglang.weight_stream import WeightStreamError

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("dist_stream", HERE / "dist_stream.py")
dist_stream = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dist_stream)

BAD = "module.model.layers.0.self_attn.q_proj.bias"  # a wrapper prefix: SGLang would skip it silently


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Three syncs into two engines (group ranks 1 and 2): whole, one with a bad name, whole again."""
    tmp = tmp_path_factory.mktemp("sglang-distributed")
    port, world = free_port(), 3
    outs = [tmp / f"rank{r}.pt" for r in (1, 2)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "scheduler_worker.py"), str(r), str(world), str(port), str(o)]
        )
        for r, o in zip((1, 2), outs, strict=True)
    ]
    result = {}
    try:
        sender = SGLangDistributedTransport(
            TransportConfig(name="sglang-distributed", timeout_s=120, bucket_bytes=800), get_platform("cpu")
        )
        sender.init_group(0, world, "127.0.0.1", port)
        sender.send(dist_stream.stream(0))
        result["stats"] = dict(sender.last_stats)
        with pytest.raises(WeightStreamError, match="module.model.layers.0") as failed:
            sender.send(dist_stream.stream(1, bad=BAD))
        result["send_error"] = str(failed.value)
        result["handle"] = sender.send(dist_stream.stream(2))
        sender.close()
        for proc in procs:
            assert proc.wait(timeout=180) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    result["seen"] = [torch.load(out) for out in outs]
    return result


def expected(sync: int, names) -> dict[str, torch.Tensor]:
    reference = dist_stream.reference(sync)
    return {name: reference[name] for name in names}


def check_loaded(params: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> None:
    for name, value in reference.items():
        assert params[name].dtype == torch.float32
        assert torch.equal(params[name], value.float()), name  # float32 of the float64 value, bit for bit
        assert torch.allclose(params[name].double(), value, rtol=1e-7, atol=0), name


def test_every_engine_loads_the_whole_stream_once_per_tensor(run):
    for seen in run["seen"]:
        assert seen["ranks"] == 1
        sync = seen["syncs"][0]
        assert sync["error"] is None
        # the tied embedding arrives once, under the name SGLang loads it by (lm_head.weight is not sent)
        assert sorted(sync["params"]) == sorted(dist_stream.LOADED)
        check_loaded(sync["params"], expected(0, dist_stream.LOADED))
        assert sync["flushes"] == 1  # the radix cache, once after the stream
        nbytes = sum(t.numel() * 4 for t in expected(0, dist_stream.LOADED).values())
        assert sync["stats"]["sync/receive_bytes"] == nbytes
        assert sync["stats"]["sync/receive_buckets"] == sync["requests"] >= 3  # 800-byte buckets
    assert run["stats"]["sync/bytes"] == nbytes and run["stats"]["sync/buckets"] == sync["requests"]


def test_a_bad_name_stops_the_sync_on_every_side_after_the_tensors_before_it(run):
    assert (
        "does not have" in run["send_error"] and "model.layers.0.self_attn.q_proj.bias" in run["send_error"]
    )
    before, after = dist_stream.LOADED[:2], dist_stream.LOADED[2:]
    for seen in run["seen"]:
        sync = seen["syncs"][1]
        assert "sender stopped the weight sync" in sync["error"] and BAD in sync["error"]
        assert "2 tensors before it were loaded" in sync["error"]
        check_loaded(sync["params"], {**expected(1, before), **expected(0, after)})
        assert sync["flushes"] == 2  # what was loaded is served: the cache is flushed anyway


def test_the_group_stays_in_step_after_a_failed_sync(run):
    assert run["handle"].sync == 2
    for seen in run["seen"]:
        sync = seen["syncs"][2]
        assert sync["error"] is None
        check_loaded(sync["params"], expected(2, dist_stream.LOADED))


def test_only_an_sglang_engine_can_be_attached():
    transport = SGLangDistributedTransport(TransportConfig(name="sglang-distributed"), get_platform("cpu"))
    with pytest.raises(TypeError, match="rollout engine sglang, or transport.name=broadcast"):
        transport.attach(object())


def test_the_receiving_end_is_the_engine_not_the_worker_process():
    transport = SGLangDistributedTransport(TransportConfig(name="sglang-distributed"), get_platform("cpu"))
    with pytest.raises(RuntimeError, match="init_group"):
        transport.send([])
    with pytest.raises(RuntimeError, match="load_into"):
        transport.receive(None)

"""The ``hccl`` weight transport: its checks, and its broadcast of bucketed weights between processes
with gloo standing in for HCCL (``hccl_stand_in``; CI has no NPU: HCCL itself is not exercised)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from rlcore.devices import get_platform
from rlcore.plugins import registry
from rlcore.transports import build_transport
from rlcore.transports.config import TransportConfig
from rlcore_ascend.transport import HCCLTransport, hccl_group_factory, register_hccl_factory
from torch.distributed import _dist2

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import hccl_stand_in  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_registered_and_refuses_a_platform_without_hccl():
    assert registry("weight_transports").get("hccl") is HCCLTransport
    with pytest.raises(
        ValueError, match=r"transport.name=hccl \(rlcore-ascend\).*'cpu' uses 'gloo'.*broadcast"
    ):
        build_transport(TransportConfig(name="hccl"), get_platform("cpu"))


def test_register_hccl_factory_keeps_an_existing_one():
    saved = _dist2._BACKENDS.pop("hccl", None)
    try:
        register_hccl_factory()
        assert _dist2._BACKENDS["hccl"] is hccl_group_factory
        sentinel = object()
        _dist2._BACKENDS["hccl"] = sentinel
        register_hccl_factory()
        assert _dist2._BACKENDS["hccl"] is sentinel
    finally:
        _dist2._BACKENDS.pop("hccl", None)
        if saved is not None:
            _dist2._BACKENDS["hccl"] = saved


def test_broadcast_of_buckets_to_two_receivers(tmp_path):
    world, port = 3, free_port()
    outs = [tmp_path / f"rank{r}.json" for r in range(1, world)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "hccl_worker.py"), str(r), str(world), str(port), str(o)]
        )
        for r, o in zip(range(1, world), outs, strict=True)
    ]
    saved = _dist2._BACKENDS.get("hccl")
    try:
        hccl_stand_in.install()
        sender = HCCLTransport(TransportConfig(name="hccl", timeout_s=120), hccl_stand_in.HCCLOnCPU())
        sender.init_group(0, world, "127.0.0.1", port)
        sent = [hccl_stand_in.buckets(0), hccl_stand_in.buckets(1)]
        for stream in sent:
            sender.send(iter(stream))
        sender.close()
        for proc in procs:
            assert proc.wait(timeout=180) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        _dist2._BACKENDS.pop("hccl", None)
        if saved is not None:
            _dist2._BACKENDS["hccl"] = saved
    want = [json.loads(json.dumps(hccl_stand_in.digest(stream))) for stream in sent]
    assert len(sent[0]) > 2  # the embedding is split over several buckets
    for out in outs:
        *syncs, stats = json.loads(out.read_text())
        assert syncs == want  # every tensor bit-exact, in the sender's bucket order
        assert stats["sync/receive_buckets"] == len(sent[1])

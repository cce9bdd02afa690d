"""The broadcast transport over gloo: the sender here, two receivers as separate processes."""

import importlib.util
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rlcore.devices import get_platform
from rlcore.transports.broadcast import BroadcastTransport, _pack, _unpack
from rlcore.transports.config import TransportConfig

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("transport_streams", HERE / "streams.py")
streams = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(streams)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_json(value):
    return json.loads(json.dumps(value))


def failing_export():
    yield from streams.buckets(2)[:2]
    raise ValueError("exporter broke on rank 0")


def test_broadcast_syncs_between_processes(tmp_path):
    port, world = free_port(), 3
    outs = [tmp_path / f"rank{r}.json" for r in (1, 2)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "broadcast_worker.py"), str(r), str(world), str(port), str(o)]
        )
        for r, o in zip((1, 2), outs, strict=True)
    ]
    try:
        sender = BroadcastTransport(TransportConfig(name="broadcast", timeout_s=120), get_platform("cpu"))
        sender.init_group(0, world, "127.0.0.1", port)
        sent = streams.buckets(0)
        handle = sender.send(iter(sent))
        assert handle.sync == 0
        payload = sum(t.numel() * t.element_size() for b in sent for _, t in b)
        assert sender.last_stats["sync/bytes"] == payload
        assert sender.last_stats["sync/buckets"] == len(sent)
        assert sender.last_stats["sync/seconds"] > 0
        sender.send(streams.buckets(1))  # receivers stop after one bucket and drain
        with pytest.raises(ValueError, match="exporter broke"):
            sender.send(failing_export())
        sender.send(streams.buckets(3))
        sender.close()
        for proc in procs:
            assert proc.wait(timeout=180) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for out in outs:
        seen = json.loads(out.read_text())
        assert seen["fingerprint"] == as_json(streams.fingerprint(sent))
        assert seen["assembled_equal"] is True
        assert seen["stats"]["sync/receive_bytes"] == payload
        assert seen["stats"]["sync/receive_buckets"] == len(sent)
        assert seen["first_bucket_of_sync1"] == as_json(streams.fingerprint(streams.buckets(1)[:1]))
        assert "exporter broke on rank 0" in seen["abort"]
        assert seen["fingerprint_sync3"] == as_json(streams.fingerprint(streams.buckets(3)))


def test_pack_aligns_every_tensor_and_round_trips():
    bucket = streams.buckets(0)[-1]
    entries, flat = _pack(bucket, torch.device("cpu"))
    assert all(offset % 64 == 0 for _, _, _, offset, _ in entries)
    out = _unpack(entries, flat.clone())
    assert streams.fingerprint([out]) == streams.fingerprint([bucket])


def test_lone_contiguous_tensor_is_sent_without_a_copy():
    tensor = torch.arange(10, dtype=torch.float32)
    _, flat = _pack([("w", tensor)], torch.device("cpu"))
    assert flat.data_ptr() == tensor.data_ptr()


def test_use_before_init_and_wrong_role():
    transport = BroadcastTransport(TransportConfig(name="broadcast"), get_platform("cpu"))
    with pytest.raises(RuntimeError, match="call init_group"):
        transport.send([])
    with pytest.raises(ValueError, match="world_size >= 2"):
        transport.init_group(0, 1, "127.0.0.1", free_port())

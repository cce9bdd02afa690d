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


def run_syncs(tmp_path, platform_name, world):
    """Sender here (rank 0), receivers 1 .. world-1 as processes; four syncs; returns what each saw."""
    port = free_port()
    outs = [tmp_path / f"rank{r}.json" for r in range(1, world)]
    worker = str(HERE / "broadcast_worker.py")
    procs = [
        subprocess.Popen([sys.executable, worker, str(r), str(world), str(port), str(o), platform_name])
        for r, o in zip(range(1, world), outs, strict=True)
    ]
    try:
        platform = get_platform(platform_name)
        platform.set_device(0)
        sender = BroadcastTransport(TransportConfig(name="broadcast", timeout_s=120), platform)
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
    return [json.loads(out.read_text()) for out in outs], sent, payload


def check_seen(seen, sent, payload):
    assert seen["fingerprint"] == as_json(streams.fingerprint(sent))
    assert seen["assembled_equal"] is True
    assert seen["stats"]["sync/receive_bytes"] == payload
    assert seen["stats"]["sync/receive_buckets"] == len(sent)
    assert seen["first_bucket_of_sync1"] == as_json(streams.fingerprint(streams.buckets(1)[:1]))
    assert "exporter broke on rank 0" in seen["abort"]
    assert seen["fingerprint_sync3"] == as_json(streams.fingerprint(streams.buckets(3)))


def test_broadcast_syncs_between_processes(tmp_path):
    all_seen, sent, payload = run_syncs(tmp_path, "cpu", world=3)
    for seen in all_seen:
        check_seen(seen, sent, payload)


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_broadcast_over_nccl(tmp_path):
    all_seen, sent, payload = run_syncs(tmp_path, "cuda", world=torch.cuda.device_count())
    for rank, seen in enumerate(all_seen, start=1):
        assert seen["device"] == f"cuda:{rank}"  # buckets arrive on the receiver's GPU
        check_seen(seen, sent, payload)


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

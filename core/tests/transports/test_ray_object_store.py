"""The Ray object-store transport on a real local Ray cluster."""

import importlib.util
from pathlib import Path

import pytest
import torch
from rlcore.transports.config import TransportConfig
from rlcore.transports.ray_object_store import RayHandle, RayObjectStoreTransport
from rlcore.weights import bucketize

ray = pytest.importorskip("ray")

_spec = importlib.util.spec_from_file_location("transport_streams", Path(__file__).parent / "streams.py")
streams = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(streams)


@pytest.fixture(scope="module")
def local_ray():
    # address="local": always a fresh cluster of our own, never one another process started on this host.
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def raw(stream):
    """Per bucket, per tensor: name, dtype, shape and every byte, as plain Python values."""
    return [
        [(n, str(t.dtype), tuple(t.shape), t.contiguous().view(-1).view(torch.uint8).tolist()) for n, t in b]
        for b in stream
    ]


@ray.remote(num_cpus=0)
class Receiver:
    def receive(self, handle):
        torch.set_num_threads(1)
        transport = RayObjectStoreTransport()
        return raw(transport.receive(handle)), transport.last_receive_stats


@pytest.fixture(scope="module")
def receiver(local_ray):
    return Receiver.remote()


def seeded_buckets(seed):
    g = torch.Generator().manual_seed(seed)
    tensors = [("a", torch.randn(300, generator=g)), ("b", torch.randn(3, 3, generator=g).to(torch.bfloat16))]
    return list(bucketize(tensors, 512))  # "a" (1200 B) splits into three pieces


@ray.remote(num_cpus=0)
class Sender:
    def send(self, seed):
        return RayObjectStoreTransport().send(iter(seeded_buckets(seed)))


def test_driver_to_actor(receiver):
    sent = streams.buckets(0)
    transport = RayObjectStoreTransport(TransportConfig(name="ray"))
    handle = transport.send(iter(sent))
    assert isinstance(handle, RayHandle) and len(handle.refs) == len(sent)
    payload = sum(t.numel() * t.element_size() for b in sent for _, t in b)
    assert transport.last_stats["sync/bytes"] == payload == handle.nbytes
    assert transport.last_stats["sync/buckets"] == len(sent)
    got, stats = ray.get(receiver.receive.remote(handle))
    assert got == raw(sent)  # names, dtypes, shapes and every byte
    assert stats["sync/receive_bytes"] == payload and stats["sync/receive_buckets"] == len(sent)
    # The driver can read the same objects (zero-copy views of the store).
    local, again = list(transport.receive(handle)), list(transport.receive(handle))
    assert streams.fingerprint(local) == streams.fingerprint(sent)
    # Zero copy: two reads of one object see the same shared memory.
    assert local[0][0][1].data_ptr() == again[0][0][1].data_ptr()


def test_actor_to_actor_through_the_driver(receiver):
    # The sender owns the objects and must outlive the receive (as a trainer worker does); the driver
    # only borrows the refs on their way to the receiver.
    sender = Sender.remote()
    handle = ray.get(sender.send.remote(7))
    got, _ = ray.get(receiver.receive.remote(handle))
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(300, generator=g), torch.randn(3, 3, generator=g).to(torch.bfloat16)
    pieces = [piece for bucket in got for piece in bucket]
    assert [p[0] for p in pieces][:3] == ["a@0/300:300", "a@128/300:300", "a@256/300:300"]
    joined = bytes(x for p in pieces[:3] for x in p[3])
    assert joined == a.view(torch.uint8).numpy().tobytes()
    assert pieces[3][:3] == ("b", "torch.bfloat16", (3, 3)) or pieces[3][:3] == [
        "b",
        "torch.bfloat16",
        [3, 3],
    ]
    assert bytes(pieces[3][3]) == b.view(torch.uint8).numpy().tobytes()


def test_needs_ray_and_a_ray_handle():
    transport = RayObjectStoreTransport()
    with pytest.raises(TypeError, match="pass what its send"):
        next(transport.receive([1, 2]))

"""The ``ipc`` transport: buckets packed into one device buffer each, shared by handle.

On CPU: the packing against the original tensors bit for bit, the errors, and when ``auto`` picks it.
On a GPU (marked): a real second process opens the handles and gets the same bytes, and the sender's
buffers are freed on ``release_sent``.
"""

import importlib.util
import multiprocessing
from pathlib import Path

import pytest
import torch
from rlcore.cluster.roles import resolve_transport_name
from rlcore.plugins import registry
from rlcore.transports import TransportConfig, build_transport
from rlcore.transports.ipc import ALIGN, IPCHandle, IPCTransport, pack, unpack
from rlcore.weights import assemble

_spec = importlib.util.spec_from_file_location("transport_streams", Path(__file__).parent / "streams.py")
streams = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(streams)


def test_registered():
    entry = registry("weight_transports").entry("ipc")
    assert entry.options["config"] is TransportConfig
    assert isinstance(build_transport(TransportConfig(name="ipc")), IPCTransport)


def test_pack_holds_every_tensor_bit_for_bit_at_aligned_offsets():
    for bucket in streams.buckets(0):
        flat, entries = pack(bucket)
        assert flat.dtype == torch.uint8 and flat.dim() == 1
        assert all(offset % ALIGN == 0 for *_, offset in entries)
        unpacked = unpack(flat, entries)
        assert streams.fingerprint([unpacked]) == streams.fingerprint([bucket])
        for _, view in unpacked:  # views of the one buffer, not copies
            assert view.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
    whole = [unpack(*pack(b)) for b in streams.buckets(1)]
    assert [n for n, _ in assemble(whole)] == [n for n, _ in streams.named_tensors(1)]


def test_packed_tensors_do_not_overlap():
    bucket = [("a", torch.ones(3, dtype=torch.float64)), ("b", torch.full((5,), 2, dtype=torch.bfloat16))]
    flat, entries = pack(bucket)
    (_, a), (_, b) = unpack(flat, entries)
    a.fill_(7)
    assert torch.equal(b, torch.full((5,), 2, dtype=torch.bfloat16))


def test_cpu_tensors_are_refused_with_the_transport_to_use():
    with pytest.raises(ValueError, match="set transport.name to 'ray'"):
        IPCTransport().send(iter(streams.buckets(0)))


def test_receive_refuses_a_foreign_handle():
    with pytest.raises(TypeError, match="'ipc' transport got a list handle"):
        list(IPCTransport().receive([]))


class _Group:
    """What ``auto`` asks a role's workers: where they run and whether their device shares memory."""

    def __init__(self, nodes, shares):
        self.nodes, self.shares = nodes, shares

    def ping(self):
        return [{"node_id": node, "hostname": "h"} for node in self.nodes]

    def call_all(self, method):
        assert method == "ipc_handles_supported"
        return [self.shares] * len(self.nodes)


class _Role:
    def __init__(self, group):
        self.group = group


@pytest.mark.parametrize(
    ("colocated", "actor_nodes", "rollout_nodes", "shares", "want"),
    [
        (True, ["n1", "n1"], ["n1"], True, "ipc"),
        (False, ["n1"], ["n1"], True, "ray"),  # split placement: the rollout has its own devices
        (True, ["n1"], ["n2"], True, "ray"),  # handles do not cross nodes
        (True, ["n1"], ["n1"], False, "ray"),  # CPU, or a device without IPC handles
    ],
)
def test_auto_picks_ipc_for_colocated_roles_on_one_node_of_sharing_devices(
    colocated, actor_nodes, rollout_nodes, shares, want
):
    actor, rollout = _Role(_Group(actor_nodes, shares)), _Role(_Group(rollout_nodes, shares))
    assert resolve_transport_name("auto", actor, rollout, colocated=colocated) == want
    assert resolve_transport_name("broadcast", actor, rollout, colocated=colocated) == "broadcast"


def _receive_in_child(handle: IPCHandle, queue) -> None:
    transport = IPCTransport()
    got = [[(name, t.clone().cpu()) for name, t in bucket] for bucket in transport.receive(handle)]
    torch.cuda.synchronize()
    queue.put((streams.fingerprint(got), transport.last_receive_stats))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_another_process_reads_the_same_bytes_on_the_gpu():
    sent = [[(n, t.cuda()) for n, t in bucket] for bucket in streams.buckets(2)]
    transport = IPCTransport()
    handle = transport.send(iter(sent))
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_receive_in_child, args=(handle, queue))
    child.start()
    fingerprint, stats = queue.get(timeout=120)
    child.join(60)
    assert child.exitcode == 0
    assert fingerprint == streams.fingerprint(sent)
    assert stats["sync/receive_buckets"] == len(sent)
    held = torch.cuda.memory_allocated()
    transport.release_sent()
    assert torch.cuda.memory_allocated() < held

"""``broadcast``: torch.distributed broadcast from the sender (rank 0) to N receivers.

A dedicated process group of ``1 + N`` ranks (trainer rank 0 plus one rank per rollout engine) over the
device platform's collective backend (``platform.dist_backend``: gloo on CPU, NCCL on CUDA, HCCL from
its plugin). The group is stand-alone: it is neither the default group nor registered with
``torch.distributed``'s global state, so it coexists with the trainer's FSDP/Megatron groups. It is
built through ``torch.distributed._dist2``'s backend factories (torch >= 2.9); a device plugin whose
backend is not there registers it with ``torch.distributed._dist2.register_backend``.

Protocol, per bucket: a JSON header (sync number, names, dtypes, shapes, byte offsets) as a length plus
bytes, then the bucket's tensors as one flat ``uint8`` buffer (offsets aligned to 64 bytes so every
tensor is a view of it). A final header ends the sync; if the sender's bucket iterator raises, an
``abort`` header carries the error to the receivers instead of leaving them blocked until the timeout.

Usage: every rank calls :meth:`BroadcastTransport.init_group` concurrently, once; then per sync the
sender calls :meth:`send` while every receiver iterates :meth:`receive` (concurrently: each broadcast
waits for all ranks). A receiver that stops early should ``close()`` its iterator (``contextlib.closing``):
the rest of the stream is then drained so the sender finishes and the group stays in step.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any

import attrs
import torch
import torch.distributed as dist

from rlcore.api import DevicePlatform, WeightBucket, WeightTransport
from rlcore.transports.config import TransportConfig
from rlcore.transports.stats import bucket_bytes, receive_stats, send_stats

_ALIGN = 64  # byte alignment of each tensor in a bucket's flat buffer


class WeightSenderFailed(RuntimeError):
    """The sender's bucket iterator raised mid-sync; receivers get its error text."""


@attrs.define
class BroadcastHandle:
    """Which sync :meth:`BroadcastTransport.send` completed. Receivers may pass it (checked) or ``None``:
    they run while the sender sends, before any handle exists."""

    sync: int


class BroadcastTransport(WeightTransport):
    config_class = TransportConfig

    def __init__(self, config: TransportConfig | None = None, platform: DevicePlatform | None = None):
        self.config = config if config is not None else TransportConfig(name="broadcast")
        if platform is None:
            from rlcore.devices import get_platform

            platform = get_platform("auto")
        self.platform = platform
        self.last_stats: dict[str, float] = {}
        self.last_receive_stats: dict[str, float] = {}
        self.rank: int | None = None
        self.world_size: int | None = None
        self.device: torch.device | None = None
        self._group: Any = None
        self._store: Any = None
        self._sync = 0

    # -- setup -----------------------------------------------------------------------------------
    def init_group(self, rank: int, world_size: int, master_addr: str, master_port: int) -> None:
        """Join the weight group: rank 0 sends, ranks ``1 .. world_size-1`` receive. All ranks call this
        concurrently with the same ``master_addr:master_port`` (rank 0 listens there)."""
        if self._group is not None:
            raise RuntimeError(f"'broadcast' transport: rank {self.rank} already joined a weight group")
        if world_size < 2 or not 0 <= rank < world_size:
            raise ValueError(
                f"'broadcast' transport: need rank in [0, world_size) and world_size >= 2 (one sender, at "
                f"least one receiver); got rank={rank}, world_size={world_size}"
            )
        timeout = timedelta(seconds=self.config.timeout_s)
        factory = _backend_factory(self.platform)
        self.device = self.platform.current_device()
        self._store = dist.TCPStore(
            master_addr, master_port, world_size, is_master=rank == 0, timeout=timeout
        )
        store = dist.PrefixStore("rlcore/weights", self._store)
        self._group = factory(store, rank, world_size, timeout, self.device)
        self.rank, self.world_size = rank, world_size

    def close(self) -> None:
        """Leave the group (every rank should, at shutdown)."""
        if self._group is not None:
            self._group.shutdown()
        self._group = self._store = None

    # -- sender ----------------------------------------------------------------------------------
    def send(self, buckets: Iterable[WeightBucket]) -> BroadcastHandle:
        self._require(sender=True)
        start, nbytes, count = time.perf_counter(), 0, 0
        iterator = iter(buckets)
        while True:
            try:
                bucket = next(iterator)
            except StopIteration:
                break
            except Exception as exc:
                self._broadcast_header({"kind": "abort", "error": f"{type(exc).__name__}: {exc}"})
                self._sync += 1
                raise
            entries, flat = _pack(bucket, self.device)
            self._broadcast_header({"kind": "bucket", "entries": entries, "nbytes": flat.numel()})
            if flat.numel():
                self._group.broadcast(flat, 0).wait()
            nbytes, count = nbytes + bucket_bytes(bucket), count + 1
        self._broadcast_header({"kind": "end"})
        self.platform.synchronize()
        self.last_stats = send_stats(nbytes, time.perf_counter() - start, count)
        self._sync += 1
        return BroadcastHandle(self._sync - 1)

    # -- receivers -------------------------------------------------------------------------------
    def receive(self, handle: BroadcastHandle | None = None) -> Iterator[WeightBucket]:
        """Buckets as the sender broadcasts them, as views of a fresh buffer on this device. The iterator's
        ``close()`` drains what is left of the sync."""
        self._require(sender=False)
        if handle is not None and handle.sync != self._sync:
            raise RuntimeError(
                f"'broadcast' transport rank {self.rank}: handle of sync {handle.sync}, but this receiver is "
                f"at sync {self._sync}; every receiver must take part in every sync"
            )
        return _ReceiveStream(self)

    def _next_bucket(self) -> WeightBucket | None:
        """The next bucket of this sync, or ``None`` (and the sync counted) at its end."""
        header = self._broadcast_header(None)
        if header["kind"] != "bucket":
            self._sync += 1
            if header["kind"] == "abort":
                raise WeightSenderFailed(
                    f"'broadcast' transport rank {self.rank}: the sender failed while exporting weights: "
                    f"{header['error']}"
                )
            return None
        flat = torch.empty(header["nbytes"], dtype=torch.uint8, device=self.device)
        if flat.numel():
            self._group.broadcast(flat, 0).wait()
        self.platform.synchronize()
        return _unpack(header["entries"], flat)

    def _drain(self) -> None:
        """Receive and drop the rest of this sync, so the sender is not left waiting on this rank."""
        try:
            while self._next_bucket() is not None:
                pass
        except WeightSenderFailed:
            pass  # the sender aborted: the sync is over either way

    # -- plumbing --------------------------------------------------------------------------------
    def _broadcast_header(self, header: dict | None) -> dict:
        """Rank 0 passes ``header`` (its sync number is added); others pass ``None`` and get rank 0's."""
        if self.rank == 0:
            header = {**header, "sync": self._sync}
            payload = torch.frombuffer(bytearray(json.dumps(header).encode()), dtype=torch.uint8)
            length = torch.tensor([payload.numel()], dtype=torch.int64)
        else:
            length = torch.zeros(1, dtype=torch.int64)
        length = length.to(self.device)
        self._group.broadcast(length, 0).wait()
        if self.rank != 0:
            payload = torch.empty(int(length.item()), dtype=torch.uint8)
        payload = payload.to(self.device)
        self._group.broadcast(payload, 0).wait()
        if self.rank == 0:
            return header
        received = json.loads(payload.cpu().numpy().tobytes())
        if received["sync"] != self._sync:
            raise RuntimeError(
                f"'broadcast' transport rank {self.rank}: the sender is at sync {received['sync']} but this "
                f"receiver at {self._sync}; every receiver must take part in every sync"
            )
        return received

    def _require(self, sender: bool) -> None:
        if self._group is None:
            raise RuntimeError(
                "'broadcast' transport: call init_group(rank, world_size, master_addr, master_port) on the "
                "sender and every receiver first"
            )
        if sender != (self.rank == 0):
            role = "send" if sender else "receive"
            raise RuntimeError(
                f"'broadcast' transport: rank {self.rank} cannot {role}; rank 0 sends, others receive"
            )


class _ReceiveStream:
    """One sync on a receiver: iterate it to the end, or ``close()`` it to drain the rest."""

    def __init__(self, transport: BroadcastTransport):
        self._transport = transport
        self._done = False
        self._seconds, self._bytes, self._buckets = 0.0, 0, 0

    def __iter__(self) -> _ReceiveStream:
        return self

    def __next__(self) -> WeightBucket:
        if self._done:
            raise StopIteration
        start = time.perf_counter()
        try:
            bucket = self._transport._next_bucket()
        except BaseException:
            self._done = True
            raise
        self._seconds += time.perf_counter() - start
        if bucket is None:
            self._done = True
            self._transport.last_receive_stats = receive_stats(self._bytes, self._seconds, self._buckets)
            raise StopIteration
        self._bytes += bucket_bytes(bucket)
        self._buckets += 1
        return bucket

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._transport._drain()


def _pack(bucket: WeightBucket, device: torch.device) -> tuple[list, torch.Tensor]:
    """``entries [[name, dtype, shape, offset, nbytes], ...]`` and the bucket as one flat uint8 buffer
    on ``device``. A lone contiguous tensor already there is sent as is (no copy)."""
    entries, offset = [], 0
    for name, tensor in bucket:
        offset = -(-offset // _ALIGN) * _ALIGN
        nbytes = tensor.numel() * tensor.element_size()
        entries.append([name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), offset, nbytes])
        offset += nbytes
    if len(bucket) == 1:
        tensor = bucket[0][1].detach()
        if tensor.is_contiguous() and tensor.device == device:
            return entries, tensor.reshape(-1).view(torch.uint8)
    flat = torch.empty(offset, dtype=torch.uint8, device=device)
    for (_, _, _, start, nbytes), (_, tensor) in zip(entries, bucket, strict=True):
        # contiguous(): reshape(-1) of e.g. x[:, ::2] is a strided view, which cannot be viewed as bytes.
        flat[start : start + nbytes].copy_(tensor.detach().contiguous().view(-1).view(torch.uint8))
    return entries, flat


def _unpack(entries: list, flat: torch.Tensor) -> WeightBucket:
    return [
        (name, flat[start : start + nbytes].view(getattr(torch, dtype)).view(shape))
        for name, dtype, shape, start, nbytes in entries
    ]


def _backend_factory(platform: DevicePlatform) -> Any:
    try:
        from torch.distributed import _dist2
    except ImportError:
        raise RuntimeError(
            f"the 'broadcast' weight transport builds its process group with torch.distributed._dist2, "
            f"which torch {torch.__version__} lacks (needs torch >= 2.9); use transport.name=ray"
        ) from None
    factory = _dist2._BACKENDS.get(platform.dist_backend)
    if factory is None:
        raise RuntimeError(
            f"the 'broadcast' weight transport has no process-group factory for backend "
            f"{platform.dist_backend!r} (device platform {platform.name!r}); the platform's plugin should "
            f"call torch.distributed._dist2.register_backend({platform.dist_backend!r}, factory). "
            f"Registered: {', '.join(sorted(_dist2._BACKENDS))}"
        )
    return factory

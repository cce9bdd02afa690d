"""``ipc``: the weight stream shared as device memory between processes of one machine (colocated roles).

The sender packs each bucket into one flat byte buffer on its device (one device-to-device copy) and
shares that buffer through torch's inter-process handles (``torch.multiprocessing.reductions``: CUDA IPC
on NVIDIA and AMD GPUs); the handle is a few hundred bytes, so nothing crosses the host. A receiver
opens the buffer (no copy) and yields views of it by name, shape and dtype, which the rollout engine
copies into its parameters. One buffer per bucket keeps the number of handles to open small: opening
one costs about as much as copying tens of megabytes.

Lifetime: the sender keeps its buffers until :meth:`IPCTransport.release_sent` (the controller calls it
once every receiver has loaded) or its next :meth:`~IPCTransport.send`, so while a sync is in flight the
sender's device holds one extra copy of the weights. Receivers must finish with the views (and
synchronize their device) before the sync returns. Tensors on the CPU cannot be shared this way: use
``ray``, whose object store already shares host memory.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from typing import Any

import attrs
import torch

from rlcore.api import WeightBucket, WeightTransport
from rlcore.transports.config import TransportConfig
from rlcore.transports.stats import bucket_bytes, receive_stats, send_stats

#: Each tensor's place in its bucket's buffer: ``(name, dtype name, shape, byte offset)``.
Entry = tuple[str, str, tuple[int, ...], int]
#: Tensors start at multiples of this many bytes in a buffer (aligned for any dtype and vector loads).
ALIGN = 256


def pack(bucket: WeightBucket, device: torch.device | None = None) -> tuple[torch.Tensor, list[Entry]]:
    """``bucket`` copied into one flat ``uint8`` tensor on ``device`` (default: the first tensor's), and
    where each tensor lies in it."""
    entries: list[Entry] = []
    offset = 0
    for name, tensor in bucket:
        entries.append((name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), offset))
        offset += -(-tensor.numel() * tensor.element_size() // ALIGN) * ALIGN
    device = device if device is not None else (bucket[0][1].device if bucket else torch.device("cpu"))
    flat = torch.empty(offset, dtype=torch.uint8, device=device)
    views = [_view(flat, entry) for entry in entries]
    if views:
        torch._foreach_copy_(views, [tensor.detach() for _, tensor in bucket])
    return flat, entries


def unpack(flat: torch.Tensor, entries: list[Entry]) -> WeightBucket:
    """The bucket :func:`pack` produced, as views of ``flat`` (no copy)."""
    return [(entry[0], _view(flat, entry)) for entry in entries]


def _view(flat: torch.Tensor, entry: Entry) -> torch.Tensor:
    _, dtype_name, shape, offset = entry
    dtype = getattr(torch, dtype_name)
    nbytes = math.prod(shape) * dtype.itemsize
    return flat[offset : offset + nbytes].view(dtype).view(shape)


@attrs.define
class IPCHandle:
    """One sync's buffers as inter-process handles (picklable), with their tensors' places."""

    #: Per bucket: ``(rebuild function, its arguments)`` from ``reduce_tensor``, and the entries.
    buffers: list[tuple[Any, tuple, list[Entry]]]
    nbytes: int


class IPCTransport(WeightTransport):
    config_class = TransportConfig

    def __init__(self, config: TransportConfig | None = None, platform: Any = None):
        self.config = config if config is not None else TransportConfig(name="ipc")
        self.platform = platform
        self.last_stats: dict[str, float] = {}
        self.last_receive_stats: dict[str, float] = {}
        self._sent: list[torch.Tensor] = []  # the buffers receivers are reading

    def send(self, buckets: Iterable[WeightBucket]) -> IPCHandle:
        from torch.multiprocessing.reductions import reduce_tensor

        start = time.perf_counter()
        self.release_sent()
        buffers, nbytes = [], 0
        for bucket in buckets:
            if not bucket:
                continue
            device = bucket[0][1].device
            if device.type == "cpu":
                raise ValueError(
                    "the 'ipc' weight transport shares device memory, but the trainer's weights are on the "
                    "CPU; set transport.name to 'ray' (its object store shares host memory) or 'auto'"
                )
            nbytes += bucket_bytes(bucket)
            flat, entries = pack(bucket, device)
            self._sent.append(flat)
            rebuild, args = reduce_tensor(flat)
            buffers.append((rebuild, args, entries))
        # The copies run asynchronously on this process's stream; another process reads the buffers
        # without ordering against it, so they must be complete before the handle leaves.
        self._synchronize()
        self.last_stats = send_stats(nbytes, time.perf_counter() - start, len(buffers))
        return IPCHandle(buffers, nbytes)

    def release_sent(self) -> None:
        """Free the buffers of the last send (every receiver has loaded them)."""
        self._sent.clear()

    def receive(self, handle: IPCHandle) -> Iterator[WeightBucket]:
        if not isinstance(handle, IPCHandle):
            raise TypeError(
                f"'ipc' transport got a {type(handle).__name__} handle; pass what its send() returned"
            )
        seconds, count = 0.0, 0
        for rebuild, args, entries in handle.buffers:
            start = time.perf_counter()
            flat = rebuild(*args)
            seconds += time.perf_counter() - start
            count += 1
            yield unpack(flat, entries)
            del flat  # the caller has copied what it needed; closing the handle frees nothing of the sender
        self.last_receive_stats = receive_stats(handle.nbytes, seconds, count)

    def _synchronize(self) -> None:
        if self.platform is not None:
            self.platform.synchronize()
        elif self._sent:
            torch.accelerator.synchronize()

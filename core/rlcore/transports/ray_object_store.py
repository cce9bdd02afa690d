"""``ray``: buckets travel through the Ray object store; works between any processes and nodes.

The sender ``ray.put``s each bucket and returns the list of ``ObjectRef``s; each receiver ``ray.get``s
one bucket at a time, so a receiver holds at most one bucket beyond what it has loaded. The sending
process owns the objects (Ray's ownership model): it must stay alive until every receiver is done, or
their ``get`` fails with ``OwnerDiedError``. The objects are freed once the handle and every copy of it
go out of scope.

Zero copy. Each tensor is put as a flat ``uint8`` numpy array (plus name, dtype, shape), which Ray
stores out of band and hands back on ``get`` as a read-only view of the shared-memory object store: one
copy in (the put), none out. A torch tensor put as is would be pickled and copied on every read (64 MB:
~150 ms against ~20 ms, FINDINGS.md) unless ``RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1`` is set in every Ray
process before Ray starts, which a transport cannot guarantee; the byte view also carries bf16, which
numpy has no dtype for. The received tensors are therefore read-only: consumers copy them (into
parameters) and must not modify them in place. Device tensors are staged to host memory on put.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import attrs
import numpy as np
import torch

from rlcore.api import WeightBucket, WeightTransport
from rlcore.transports.config import TransportConfig
from rlcore.transports.stats import bucket_bytes, receive_stats, send_stats

#: One tensor in the store: ``(name, dtype name, shape, flat uint8 array)``.
_Packed = tuple[str, str, tuple[int, ...], np.ndarray]


@attrs.define
class RayHandle:
    """The object refs of one sync's buckets, in order (picklable; receivers borrow the objects)."""

    refs: list[Any]
    nbytes: int


class RayObjectStoreTransport(WeightTransport):
    config_class = TransportConfig

    def __init__(self, config: TransportConfig | None = None, platform: Any = None):
        self.config = config if config is not None else TransportConfig(name="ray")
        self.platform = platform
        self.last_stats: dict[str, float] = {}
        self.last_receive_stats: dict[str, float] = {}

    def send(self, buckets: Iterable[WeightBucket]) -> RayHandle:
        import ray

        if not ray.is_initialized():
            raise RuntimeError("the 'ray' weight transport needs Ray: call ray.init() (rlcore train does)")
        start = time.perf_counter()
        refs, nbytes = [], 0
        for bucket in buckets:
            nbytes += bucket_bytes(bucket)
            refs.append(ray.put([_pack(name, tensor) for name, tensor in bucket]))
        self.last_stats = send_stats(nbytes, time.perf_counter() - start, len(refs))
        return RayHandle(refs, nbytes)

    def receive(self, handle: RayHandle) -> Iterator[WeightBucket]:
        import ray

        if not isinstance(handle, RayHandle):
            raise TypeError(
                f"'ray' transport got a {type(handle).__name__} handle; pass what its send() returned"
            )
        seconds, nbytes = 0.0, 0
        for ref in handle.refs:
            start = time.perf_counter()
            bucket = [_unpack(packed) for packed in ray.get(ref)]
            seconds += time.perf_counter() - start
            nbytes += bucket_bytes(bucket)
            yield bucket
        self.last_receive_stats = receive_stats(nbytes, seconds, len(handle.refs))


def _pack(name: str, tensor: torch.Tensor) -> _Packed:
    # contiguous() copies only a non-contiguous tensor (reshape(-1) may return a strided view, e.g. of
    # x[:, ::2], which cannot be viewed as bytes); cpu() copies only a device tensor.
    flat = tensor.detach().cpu().contiguous().view(-1)
    return name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), flat.view(torch.uint8).numpy()


def _unpack(packed: _Packed) -> tuple[str, torch.Tensor]:
    name, dtype, shape, array = packed
    with warnings.catch_warnings():
        # The store's memory is immutable; torch warns that the tensor it wraps is not writable.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        raw = torch.from_numpy(array)
    return name, raw.view(getattr(torch, dtype)).view(shape)

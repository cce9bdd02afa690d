"""Moving :class:`~rlcore.api.Batch` objects between Ray processes without pickling tensors.

Pickling a torch tensor goes through torch's own serializer, which copies the data into a byte string
in-band; Ray then copies that string into its object store and the reader copies it out again (a 64 MB
tensor: ~150 ms, FINDINGS.md). Ray's own fix (``RAY_ENABLE_ZERO_COPY_TORCH_TENSORS``) is global, must be
set before Ray starts in every process, and hands readers tensors that alias read-only shared memory.

Instead a batch crosses as :class:`WireBatch`: each tensor becomes a flat ``uint8`` numpy view of its
memory (no copy; numpy arrays travel out of band, straight into the object store), plus its dtype name
and shape. The reader rebuilds each tensor with one ``memcpy`` out of the store, so it owns writable
memory (engines may modify batches in place). bf16 crosses too: the bytes carry any dtype.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from rlcore.api import Batch

#: One tensor on the wire: ``(dtype name, shape, flat uint8 array)``.
Packed = tuple[str, tuple[int, ...], np.ndarray]


def pack_tensor(tensor: torch.Tensor) -> Packed:
    """A tensor as ``(dtype, shape, bytes)``; no copy for a contiguous CPU tensor."""
    # Copies only a device or non-contiguous tensor (reshape alone may return a strided view).
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), flat.view(torch.uint8).numpy()


def unpack_tensor(packed: Packed) -> torch.Tensor:
    """The tensor :func:`pack_tensor` described, in freshly owned (writable) memory."""
    dtype, shape, array = packed
    with warnings.catch_warnings():
        # Ray hands back read-only views of its store; we copy right away, so torch's warning is moot.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        raw = torch.from_numpy(array)
    return raw.clone().view(getattr(torch, dtype)).view(shape)


class WireBatch:
    """Wraps a batch for the trip; unpickles as a plain :class:`Batch`."""

    __slots__ = ("batch",)

    def __init__(self, batch: Batch):
        self.batch = batch

    def __reduce__(self):
        b = self.batch
        tensors = {k: pack_tensor(v) for k, v in b.tensors.items()}
        return (_rebuild_batch, (tensors, b.objects, b.meta))


def _rebuild_batch(tensors: dict[str, Packed], objects: dict[str, list], meta: dict[str, Any]) -> Batch:
    return Batch({k: unpack_tensor(v) for k, v in tensors.items()}, objects, meta)


def to_wire(value: Any) -> Any:
    """``value`` ready to cross processes: a batch is wrapped, anything else passes as is."""
    return WireBatch(value) if isinstance(value, Batch) else value


def from_wire(value: Any) -> Any:
    """Undo :func:`to_wire` where no pickling happened in between (in-process calls)."""
    return value.batch if isinstance(value, WireBatch) else value

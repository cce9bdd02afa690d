"""The weight stream: ``(hf_name, tensor)`` pairs grouped into byte-bounded buckets.

Train engines produce it with :func:`bucketize`; rollout engines consume it with :func:`assemble`.
A tensor larger than a bucket is split along its flattened elements into pieces named
``"<name>@<offset>/<numel>:<shape>"`` and reassembled by :func:`assemble`; it is never rejected.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch

from rlcore.api.train_engine import WeightBucket

_PIECE = re.compile(r"^(?P<name>.+)@(?P<offset>\d+)/(?P<numel>\d+):(?P<shape>[\d,]*)$")


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def bucketize(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int, dtype: torch.dtype | None = None
) -> Iterator[WeightBucket]:
    """Group ``named_tensors`` (cast to ``dtype`` if given) into buckets of at most ``bucket_bytes``."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    bucket: WeightBucket = []
    used = 0
    for name, tensor in named_tensors:
        tensor = tensor.detach()
        if dtype is not None and tensor.dtype != dtype:
            tensor = tensor.to(dtype)
        size = tensor_bytes(tensor)
        if size > bucket_bytes:
            if bucket:
                yield bucket
                bucket, used = [], 0
            yield from _split(name, tensor, bucket_bytes)
            continue
        if used + size > bucket_bytes and bucket:
            yield bucket
            bucket, used = [], 0
        bucket.append((name, tensor))
        used += size
    if bucket:
        yield bucket


def _split(name: str, tensor: torch.Tensor, bucket_bytes: int) -> Iterator[WeightBucket]:
    flat = tensor.contiguous().view(-1)
    per = max(1, bucket_bytes // tensor.element_size())
    shape = ",".join(str(s) for s in tensor.shape)
    for offset in range(0, flat.numel(), per):
        piece = flat[offset : offset + per]
        yield [(f"{name}@{offset}/{flat.numel()}:{shape}", piece)]


def assemble(buckets: Iterable[WeightBucket]) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield whole ``(name, tensor)`` pairs from a bucket stream, joining split tensors in order."""
    pending: dict[str, tuple[torch.Tensor, int]] = {}
    for bucket in buckets:
        for name, tensor in bucket:
            match = _PIECE.match(name)
            if match is None:
                yield name, tensor
                continue
            base, offset = match["name"], int(match["offset"])
            numel = int(match["numel"])
            shape = tuple(int(s) for s in match["shape"].split(",") if s)
            if base not in pending:
                pending[base] = (torch.empty(numel, dtype=tensor.dtype, device=tensor.device), 0)
            buf, filled = pending[base]
            if offset != filled:
                raise ValueError(f"weight stream piece of {base!r} at offset {offset} arrived out of order")
            buf[offset : offset + tensor.numel()] = tensor
            filled += tensor.numel()
            if filled == numel:
                del pending[base]
                yield base, buf.view(shape)
            else:
                pending[base] = (buf, filled)
    if pending:
        raise ValueError(f"weight stream ended with incomplete tensors: {sorted(pending)}")

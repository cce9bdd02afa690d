"""The weight stream: ``(hf_name, tensor)`` pairs grouped into byte-bounded buckets.

Train engines produce it with :func:`bucketize`; rollout engines consume it with :func:`assemble`.
A tensor larger than a bucket is split along its flattened elements into pieces named
``"<name>@<offset>/<numel>:<shape>"`` and reassembled by :func:`assemble`; it is never rejected.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Iterator, Mapping

import attrs
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
            match = _PIECE.match(name) if "@" in name else None  # most names are whole tensors
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


@attrs.frozen
class WeightLayout:
    """The weights a Hugging Face causal LM takes, for a rollout engine checking a stream before loading it.

    ``shapes``: full (unsharded) shape per name, as in ``model.state_dict()``. ``ties``: name -> every name
    sharing its tensor, in ``named_parameters`` order (tied names only: ``lm_head.weight`` and
    ``model.embed_tokens.weight`` with ``tie_word_embeddings``).
    """

    model_path: str
    shapes: Mapping[str, tuple[int, ...]]
    ties: Mapping[str, tuple[str, ...]]

    @classmethod
    def from_pretrained(cls, model_path: str) -> WeightLayout:
        """Read from the checkpoint's config, with the model built on the meta device (no memory, no
        weights read)."""
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(model_path)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
        by_tensor: dict[int, list[str]] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            by_tensor.setdefault(id(param), []).append(name)
        ties = {name: tuple(names) for names in by_tensor.values() if len(names) > 1 for name in names}
        return cls(model_path, shapes, ties)

    def mismatch(self, name: str, tensor: torch.Tensor) -> str | None:
        """Why ``(name, tensor)`` does not fit this model (an unknown name, with the closest valid ones, or
        a wrong shape), or None when it fits. The engine raises its own error type with this message."""
        shape = self.shapes.get(name)
        if shape is None:
            valid = list(self.shapes)
            close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6) or valid[:3]
            return (
                f"weight stream sent {name!r}, which the rollout model ({self.model_path}) does not have. "
                f"Close valid names: {', '.join(map(repr, close))}. The stream must use Hugging Face "
                f"parameter names (model.state_dict()), without wrapper prefixes such as 'module.'."
            )
        if tuple(tensor.shape) != shape:
            return (
                f"weight stream sent {name!r} with shape {tuple(tensor.shape)}, but the rollout model "
                f"({self.model_path}) has shape {shape}; do the trainer and rollout load the same "
                f"architecture? (streams carry full, unsharded tensors)"
            )
        return None

"""From rlcore's weight stream to SGLang's flattened buckets (torch only: no sglang).

SGLang loads weights inside its scheduler process, through the model's own ``load_weights``. What it
does with a bad stream is why every tensor is checked here first, against the Hugging Face model the
engine serves (built on the meta device from the checkpoint's config):

- a name it does not know is skipped with a log line (a wrapper prefix such as ``module.`` would make a
  whole sync a silent no-op), and a wrong shape fails an assertion in the scheduler, which kills the
  engine; so both raise :class:`WeightStreamError` here, before the tensor is sent;
- with tied embeddings SGLang's model holds one tensor, loaded under the first tied name (for Qwen2,
  ``model.embed_tokens.weight``) and skipped under the others; so a tied tensor is sent once, under
  that name, whichever of its names the trainer used (and differing values under two tied names raise).

Tensors are then packed into byte-bounded flattened buckets, SGLang's ``flattened_bucket`` load format:
one ``uint8`` tensor holding each tensor's bytes back to back, and per tensor its name, shape, dtype and
byte range. One ``update_weights_from_tensor`` call carries a whole bucket through one CUDA IPC handle,
instead of one handle per tensor. :func:`unpack` is the inverse (what SGLang's
``FlattenedTensorBucket.reconstruct_tensors`` does), for tests and for SGLang versions without the format.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import attrs
import torch
from rlcore.api import WeightBucket
from rlcore.weights import WeightLayout, assemble


class WeightStreamError(ValueError):
    """A weight stream did not fit the model. ``loaded`` names the tensors sent to SGLang before the
    error (every other weight keeps its previous value)."""

    def __init__(self, message: str, loaded: tuple[str, ...] = ()):
        super().__init__(message)
        self.loaded = loaded


@attrs.define(frozen=True)
class ModelWeights:
    """The weights a rollout model accepts, in Hugging Face names (:class:`rlcore.weights.WeightLayout`).

    ``canonical``: tied name -> the name its tensor is sent under (the first of its group in
    ``named_parameters`` order); untied names are absent.
    """

    layout: WeightLayout

    @classmethod
    def from_pretrained(cls, model_path: str) -> ModelWeights:
        return cls(WeightLayout.from_pretrained(model_path))

    @property
    def canonical(self) -> dict[str, str]:
        return {name: names[0] for name, names in self.layout.ties.items()}

    def targets(self) -> frozenset[str]:
        """The names a complete stream is sent under (tied groups once)."""
        canonical = self.canonical
        return frozenset(canonical.get(name, name) for name in self.layout.shapes)

    def check(self, name: str, tensor: torch.Tensor) -> None:
        """Raise :class:`WeightStreamError` unless ``name`` is a weight of this model with this shape."""
        message = self.layout.mismatch(name, tensor)
        if message is not None:
            raise WeightStreamError(message)


def checked_tensors(
    buckets: Iterable[WeightBucket], weights: ModelWeights, dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    """Whole tensors of ``buckets`` (split ones joined), checked, cast to ``dtype``, tied ones once
    under their canonical name. Raises :class:`WeightStreamError` at the first bad tensor, before
    yielding it; the stream's ``close()`` (a transport draining what is left) runs either way."""
    received: set[str] = set()
    canonical = weights.canonical
    tied: dict[str, tuple[str, torch.Tensor]] = {}  # canonical name -> first (name, value) received
    try:
        for name, tensor in assemble(buckets):
            weights.check(name, tensor)
            if name in received:
                raise WeightStreamError(f"weight stream sent {name!r} twice")
            received.add(name)
            tensor = tensor.to(dtype)
            target = canonical.get(name)
            if target is None:
                yield name, tensor
                continue
            first = tied.get(target)
            if first is None:
                tied[target] = (name, tensor)
                yield target, tensor
            elif not torch.equal(first[1], tensor.to(first[1].device)):
                raise WeightStreamError(
                    f"the rollout model ties {first[0]!r} and {name!r} (one tensor), but the weight stream "
                    f"sent different values for them; does the trainer untie embeddings "
                    f"(tie_word_embeddings) while the rollout model ties them?"
                )
    finally:
        close = getattr(buckets, "close", None)
        if close is not None:
            close()


@attrs.frozen
class TensorSlot:
    """Where one tensor lies in a flattened bucket: bytes ``[start, end)``, as SGLang's
    ``FlattenedTensorMetadata`` (whose ``numel`` is the byte count)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    start: int
    end: int


@attrs.define
class PackedBucket:
    """One flattened bucket: ``flat`` (``uint8 [nbytes]``) and the slot of each tensor in it."""

    flat: torch.Tensor
    slots: list[TensorSlot]

    @property
    def names(self) -> list[str]:
        return [slot.name for slot in self.slots]


def pack(
    named: Iterable[tuple[str, torch.Tensor]], *, bucket_bytes: int, device: torch.device
) -> Iterator[PackedBucket]:
    """Flatten ``named`` into buckets of at most ``bucket_bytes`` on ``device`` (a larger tensor gets a
    bucket of its own: tensors are never split, SGLang loads whole ones).

    Tensors are held (by reference) until their bucket is full, then copied into it once. If ``named``
    raises, the tensors before the failure are still packed and yielded, then the error is re-raised:
    the caller loads everything that was valid, as far as it went, and reports the rest.
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    held: list[tuple[str, torch.Tensor]] = []
    used = 0
    error: BaseException | None = None
    try:
        for name, tensor in named:
            size = tensor.numel() * tensor.element_size()
            if held and used + size > bucket_bytes:
                yield _flatten(held, device)
                held, used = [], 0
            held.append((name, tensor))
            used += size
    except Exception as exc:
        error = exc
    if held:
        yield _flatten(held, device)
    if error is not None:
        raise error


def _flatten(named: list[tuple[str, torch.Tensor]], device: torch.device) -> PackedBucket:
    sizes = [t.numel() * t.element_size() for _, t in named]
    flat = torch.empty(sum(sizes), dtype=torch.uint8, device=device)
    slots = []
    start = 0
    for (name, tensor), size in zip(named, sizes, strict=True):
        # A byte view of the contiguous tensor: one copy straight into the bucket, whatever the dtype.
        flat[start : start + size].copy_(tensor.detach().contiguous().view(-1).view(torch.uint8))
        slots.append(TensorSlot(name, tuple(tensor.shape), tensor.dtype, start, start + size))
        start += size
    return PackedBucket(flat, slots)


def unpack(bucket: PackedBucket) -> list[tuple[str, torch.Tensor]]:
    """The tensors of ``bucket`` as views of its bytes (SGLang's ``reconstruct_tensors``)."""
    return [(s.name, bucket.flat[s.start : s.end].view(s.dtype).reshape(s.shape)) for s in bucket.slots]

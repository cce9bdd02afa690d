"""The weight stream: ``(hf_name, tensor)`` pairs grouped into byte-bounded buckets.

Train engines produce it with :func:`bucketize`; rollout engines consume it with :func:`assemble`.
A tensor larger than a bucket is split along its flattened elements into pieces named
``"<name>@<offset>/<numel>:<shape>"`` and reassembled by :func:`assemble`; it is never rejected.

Names and layouts are the Hugging Face *checkpoint's* (what ``save_pretrained`` writes and vLLM, SGLang
and ``from_pretrained`` read), which transformers 5 no longer keeps in memory for every model: the
experts of a mixture-of-experts layer are one fused tensor per projection in memory
(``mlp.experts.gate_up_proj [E, 2I, H]``) and per-expert tensors in the checkpoint
(``mlp.experts.{e}.gate_proj.weight [I, H]``). :class:`CheckpointFormat` converts between the two.
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
    #: In-memory names the checkpoint stores otherwise -> their checkpoint names (fused experts), for
    #: error messages.
    in_memory: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)

    @classmethod
    def from_pretrained(cls, model_path: str) -> WeightLayout:
        """Read from the checkpoint's config, with the model built on the meta device (no memory, no
        weights read); names and shapes are the checkpoint's (:class:`CheckpointFormat`)."""
        from transformers import AutoConfig

        from rlcore.vision.inputs import model_class

        config = AutoConfig.from_pretrained(model_path)
        with torch.device("meta"):
            model = model_class(model_path).from_config(config)
        form = CheckpointFormat(model)
        by_tensor: dict[int, list[str]] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            by_tensor.setdefault(id(param), []).append(name)
        # A tied tensor the checkpoint only renames (a VLM's ``model.language_model.embed_tokens`` is
        # ``model.embed_tokens`` there) is tied under its checkpoint name; one stored in another layout
        # (split or fused) cannot be checked.
        renamed = {name: parts[0] for name, parts in form.converted.items() if len(parts) == 1}
        by_tensor = {key: [renamed.get(n, n) for n in names] for key, names in by_tensor.items()}
        ties = {name: tuple(names) for names in by_tensor.values() if len(names) > 1 for name in names}
        if any(name in form.converted for name in ties):
            raise NotImplementedError(
                f"{model_path}: tied weights {sorted(set(ties) & set(form.converted))} are stored in another "
                f"layout in the checkpoint; the weight stream cannot check them"
            )
        in_memory = {name: tuple(parts) for name, parts in form.converted.items()}
        return cls(model_path, form.shapes, ties, in_memory)

    def mismatch(self, name: str, tensor: torch.Tensor) -> str | None:
        """Why ``(name, tensor)`` does not fit this model (an unknown name, with the closest valid ones, or
        a wrong shape), or None when it fits. The engine raises its own error type with this message."""
        shape = self.shapes.get(name)
        if shape is None and name in self.in_memory:
            parts = self.in_memory[name]
            return (
                f"weight stream sent {name!r}, the in-memory (fused) form of {len(parts)} checkpoint tensors "
                f"({parts[0]!r}, ...) of the rollout model ({self.model_path}). The stream carries "
                f"checkpoint names and layouts: convert with rlcore.weights.CheckpointFormat(model)"
                f".to_checkpoint(named_tensors)."
            )
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


class CheckpointFormat:
    """How a transformers model's weights (``model.state_dict()``) are named and laid out in its checkpoint.

    transformers 5 loads some checkpoint tensors into another layout and converts them back when saving
    (``transformers.core_model_loading.revert_weight_conversion``, which ``save_pretrained`` runs): the
    experts of Qwen2/3-MoE, Mixtral, DeepSeek and other mixtures of experts are one fused tensor per
    projection in memory, ``model.layers.0.mlp.experts.gate_up_proj [E, 2I, H]`` and
    ``...experts.down_proj [E, H, I]``, and per-expert tensors in the checkpoint,
    ``...mlp.experts.{e}.{gate,up,down}_proj.weight`` (Mixtral's
    ``...block_sparse_moe.experts.{e}.{w1,w3,w2}.weight``, its router under ``block_sparse_moe.gate``).
    This applies transformers' own reverse conversion one tensor at a time, so an export streams
    checkpoint tensors without gathering the model first; for models without conversions (and with
    transformers 4, which kept checkpoint layouts in memory) every name maps to itself.

    ``converted``: in-memory name -> the checkpoint names it becomes (only names that change).
    ``shapes``: checkpoint name -> shape, for every weight.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        meta = {
            name: torch.empty(tuple(t.shape), dtype=t.dtype, device="meta")
            for name, t in model.state_dict().items()
        }
        whole = _revert_weight_conversion(model, meta)
        self.shapes: dict[str, tuple[int, ...]] = {name: tuple(t.shape) for name, t in whole.items()}
        self.converted: dict[str, tuple[str, ...]] = {}
        if set(whole) == set(meta) and all(whole[n].shape == t.shape for n, t in meta.items()):
            return  # nothing is converted (every dense model)
        one_by_one: dict[str, tuple[int, ...]] = {}
        for name, tensor in meta.items():
            out = _revert_weight_conversion(model, {name: tensor})
            one_by_one.update((n, tuple(t.shape)) for n, t in out.items())
            if list(out) != [name] or out[name].shape != tensor.shape:
                self.converted[name] = tuple(out)
        if one_by_one != self.shapes:
            raise NotImplementedError(
                f"{type(model).__name__}: transformers builds some checkpoint tensors of this model from "
                f"several in-memory tensors together, which a weight stream cannot convert one tensor at "
                f"a time (checkpoint names differing: {sorted(set(one_by_one) ^ set(self.shapes))[:4]})"
            )

    def to_checkpoint(self, named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """``(in-memory name, tensor)`` pairs as checkpoint pairs, in order: converted tensors become
        their parts (contiguous copies), every other pair passes unchanged (names this model's state dict
        does not have as well, such as merged LoRA weights)."""
        for name, tensor in named:
            parts = self.converted.get(name)
            if parts is None:
                yield name, tensor
                continue
            out = _revert_weight_conversion(self.model, {name: tensor})
            if tuple(out) != parts:
                raise RuntimeError(f"{name!r} converted to {list(out)[:3]}..., expected {parts[:3]}...")
            for part in parts:
                yield part, out[part].contiguous()

    @torch.no_grad()
    def copy_into(self, state: Mapping[str, torch.Tensor], tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy checkpoint-named ``tensors`` into the in-memory tensors ``state`` (``model.state_dict()``)
        they belong to, cast to their dtype; a converted tensor may receive only some of its parts.

        The reverse conversions are rearrangements (splits, chunks, transposes), so running one on a
        tensor of flat indices says which element of the fused tensor each checkpoint element is."""
        parts_of = {part: name for name, parts in self.converted.items() for part in parts}
        pending: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in tensors.items():
            owner = parts_of.get(name)
            if owner is None:
                state[name].copy_(tensor)
            else:
                pending.setdefault(owner, {})[name] = tensor
        for owner, parts in pending.items():
            target = state[owner]
            index = torch.arange(target.numel(), device=target.device).view(target.shape)
            where = _revert_weight_conversion(self.model, {owner: index})
            flat = target.view(-1)
            for name, tensor in parts.items():
                flat[where[name].reshape(-1)] = tensor.reshape(-1).to(flat.device, flat.dtype)


def _revert_weight_conversion(
    model: torch.nn.Module, state: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4 keeps checkpoint layouts in memory
        return state
    return revert_weight_conversion(model, state)

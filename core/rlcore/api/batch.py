"""The batch container carried through every phase of a step.

A :class:`Batch` holds ``B`` samples: tensors whose first dimension is ``B`` and per-sample Python
objects (lists of length ``B``), plus batch-level ``meta``. It is deliberately thin (a dict of tensors
with consistent slicing) and pickles cheaply across Ray.

Standard keys (verl's names, so verl code ports):

=====================  ===========  ==========================================================
key                    shape        meaning
=====================  ===========  ==========================================================
``prompts``            ``[B, P]``   prompt token ids, left-padded with the pad id
``responses``          ``[B, R]``   response token ids, right-padded
``input_ids``          ``[B, P+R]`` ``cat(prompts, responses)``
``attention_mask``     ``[B, P+R]`` 1 on real tokens
``position_ids``       ``[B, P+R]`` positions counted over real tokens
``response_mask``      ``[B, R]``   1 on response tokens that count in losses (0 on tool-observation
                                    tokens of a multi-turn episode, which ``attention_mask`` keeps)
``old_log_probs``      ``[B, R]``   log-probs of the trainer before the update (absent in an on-policy update)
``ref_log_prob``       ``[B, R]``   reference policy log-probs
``values``             ``[B, R]``   critic values
``token_level_scores`` ``[B, R]``   reward before KL penalty
``token_level_rewards`` ``[B, R]``  reward after KL penalty
``advantages``         ``[B, R]``
``returns``            ``[B, R]``
=====================  ===========  ==========================================================

Per-sample objects: ``uid`` (group id: samples of one prompt share it), ``data_source``,
``ground_truth``, ``extra_info``, ``response_text``. Meta: ``pad_token_id``, the id token fields are
padded with (set by :func:`~rlcore.rollout.batching.completions_to_batch`).

Engines find each response at column ``P = T - R`` of the ``[B, P+R]`` fields (``R =
responses.shape[1]``, 0 in a batch of prompts only). :meth:`Batch.concat` keeps that when batches of
different ``P`` and ``R`` meet (DAPO's generation rounds): the merged batch has the widest ``P`` and
``R``; the prompt part of :data:`SEQUENCE_KEYS` and the :data:`PROMPT_KEYS` are left-padded, the
response part and every other field right-padded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

#: ``[B, P+R]`` fields: a left-padded prompt of width ``P``, then a right-padded response of width ``R``.
SEQUENCE_KEYS = ("input_ids", "attention_mask", "position_ids")
#: ``[B, P]`` fields, left-padded.
PROMPT_KEYS = ("prompts", "prompt_mask")
#: Token id fields, padded with ``meta["pad_token_id"]``. Other fields pad with 0, except that
#: ``position_ids`` repeats each row's last position on the right (as ``completions_to_batch`` does).
TOKEN_KEYS = ("prompts", "responses", "input_ids")


class Batch:
    """``tensors`` (each ``[B, ...]``), ``objects`` (each a list of ``B`` items) and ``meta``."""

    __slots__ = ("tensors", "objects", "meta")

    def __init__(
        self,
        tensors: Mapping[str, torch.Tensor] | None = None,
        objects: Mapping[str, Sequence[Any]] | None = None,
        meta: Mapping[str, Any] | None = None,
    ):
        self.tensors: dict[str, torch.Tensor] = dict(tensors or {})
        self.objects: dict[str, list[Any]] = {k: list(v) for k, v in (objects or {}).items()}
        self.meta: dict[str, Any] = dict(meta or {})
        self._check()

    def _check(self) -> None:
        sizes = {k: v.shape[0] for k, v in self.tensors.items()}
        sizes.update({k: len(v) for k, v in self.objects.items()})
        if len(set(sizes.values())) > 1:
            raise ValueError(f"batch fields disagree on the batch size: {sizes}")

    # -- access ----------------------------------------------------------------------------------
    def __len__(self) -> int:
        for v in self.tensors.values():
            return v.shape[0]
        for v in self.objects.values():
            return len(v)
        return 0

    def __getitem__(self, key: str) -> Any:
        if key in self.tensors:
            return self.tensors[key]
        if key in self.objects:
            return self.objects[key]
        raise KeyError(
            f"batch has no field {key!r}; tensors: {sorted(self.tensors)}, objects: {sorted(self.objects)}"
        )

    def __contains__(self, key: object) -> bool:
        return key in self.tensors or key in self.objects

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def keys(self) -> list[str]:
        return [*self.tensors, *self.objects]

    def __repr__(self) -> str:
        shapes = {k: tuple(v.shape) for k, v in self.tensors.items()}
        return f"Batch(size={len(self)}, tensors={shapes}, objects={sorted(self.objects)}, meta={sorted(self.meta)})"

    # -- building --------------------------------------------------------------------------------
    def update(self, other: Batch | None = None, **tensors: torch.Tensor) -> Batch:
        """Add (or replace) fields in place from ``other`` and keyword tensors; returns ``self``."""
        if other is not None:
            self.tensors.update(other.tensors)
            self.objects.update({k: list(v) for k, v in other.objects.items()})
            self.meta.update(other.meta)
        self.tensors.update(tensors)
        self._check()
        return self

    def select(self, *keys: str) -> Batch:
        """A batch with only ``keys`` (tensors shared, not copied)."""
        missing = [k for k in keys if k not in self]
        if missing:
            self[missing[0]]  # raises the descriptive KeyError
        return Batch(
            {k: v for k, v in self.tensors.items() if k in keys},
            {k: v for k, v in self.objects.items() if k in keys},
            self.meta,
        )

    def index(self, idx: torch.Tensor | Sequence[int] | slice) -> Batch:
        """Rows ``idx`` (a slice, a list of row numbers, or a bool/long tensor)."""
        if isinstance(idx, slice):
            rows = list(range(len(self)))[idx]
        elif isinstance(idx, torch.Tensor) and idx.dtype == torch.bool:
            rows = idx.nonzero().flatten().tolist()
        else:
            rows = [int(i) for i in idx]
        t = torch.as_tensor(rows, dtype=torch.long)
        return Batch(
            {k: v.index_select(0, t.to(v.device)) for k, v in self.tensors.items()},
            {k: [v[i] for i in rows] for k, v in self.objects.items()},
            self.meta,
        )

    def split(self, size: int) -> list[Batch]:
        """Consecutive pieces of ``size`` rows (the last may be shorter)."""
        if size < 1:
            raise ValueError(f"split size must be >= 1, got {size}")
        return [self.index(slice(i, i + size)) for i in range(0, len(self), size)]

    def chunk(self, n: int) -> list[Batch]:
        """``n`` consecutive pieces whose sizes differ by at most one (data-parallel dispatch)."""
        if n < 1:
            raise ValueError(f"chunk count must be >= 1, got {n}")
        base, extra = divmod(len(self), n)
        out, start = [], 0
        for i in range(n):
            stop = start + base + (1 if i < extra else 0)
            out.append(self.index(slice(start, stop)))
            start = stop
        return out

    def repeat(self, times: int, interleave: bool = True) -> Batch:
        """Each row ``times`` times: ``aabb`` when ``interleave`` else ``abab``."""
        n = len(self)
        rows = (
            [i for i in range(n) for _ in range(times)]
            if interleave
            else [i for _ in range(times) for i in range(n)]
        )
        return self.index(rows)

    @staticmethod
    def concat(batches: Iterable[Batch]) -> Batch:
        """Rows of all ``batches`` in order; they must have the same fields. Meta comes from the first.

        Parts of different widths are padded to the widest in the standard layout (see the module
        docstring); padding a token field needs the parts' common ``meta["pad_token_id"]``.
        """
        batches = [b for b in batches if b is not None]
        if not batches:
            return Batch()
        keys = set(batches[0].keys())
        for b in batches[1:]:
            if set(b.keys()) != keys:
                raise ValueError(
                    f"cannot concat batches with different fields: {sorted(keys)} vs {sorted(b.keys())}"
                )
        tensors = {k: torch.cat(_pad_to_common(k, batches), dim=0) for k in batches[0].tensors}
        objects = {k: [x for b in batches for x in b.objects[k]] for k in batches[0].objects}
        return Batch(tensors, objects, batches[0].meta)

    def to(self, device: torch.device | str, pin: bool = False) -> Batch:
        """The tensors on ``device`` (see :func:`to_device` for ``pin``)."""
        tensors = {k: to_device(v, device, pin) for k, v in self.tensors.items()}
        return Batch(tensors, self.objects, self.meta)


def to_device(tensor: torch.Tensor, device: torch.device | str, pin: bool = False) -> torch.Tensor:
    """``tensor`` on ``device``. ``pin`` stages host tensors through pinned memory (it needs an
    accelerator): a copy from pageable memory first waits for every kernel already queued, so the host
    could not prepare the next micro-batch while the device computes this one."""
    if pin and tensor.device.type == "cpu":
        return pinnable(tensor).pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def pinnable(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, made dense where it is not (a dense one is returned as is): ``pin_memory`` copies into
    a buffer of the same strides and refuses one whose elements share memory (an ``expand``-ed mask or
    position row)."""
    return tensor.contiguous()


def _pad_to_common(key: str, batches: list[Batch]) -> list[torch.Tensor]:
    """Field ``key`` of each batch, padded on dim 1 to the merged batch's width of it."""
    parts = [b.tensors[key] for b in batches]
    if parts[0].dim() < 2:
        return parts
    widths = [p.shape[1] for p in parts]
    if key in SEQUENCE_KEYS:
        responses = [b.tensors["responses"].shape[1] if "responses" in b.tensors else 0 for b in batches]
        prompts = [w - r for w, r in zip(widths, responses, strict=True)]
        if min(prompts) < 0:
            i = prompts.index(min(prompts))
            raise ValueError(
                f"cannot concat: batch {i}'s {key} is {widths[i]} wide, narrower than its responses "
                f"({responses[i]}); a [B, P+R] field must end with the response"
            )
        lefts = [max(prompts) - p for p in prompts]
        rights = [max(responses) - r for r in responses]
    elif key in PROMPT_KEYS:
        lefts, rights = [max(widths) - w for w in widths], [0] * len(parts)
    else:
        lefts, rights = [0] * len(parts), [max(widths) - w for w in widths]
    if not any(lefts) and not any(rights):
        return parts
    value = _pad_token_id(key, batches) if key in TOKEN_KEYS else 0
    return [
        _pad(p, left, right, value, repeat_last=key == "position_ids")
        for p, left, right in zip(parts, lefts, rights, strict=True)
    ]


def _pad_token_id(key: str, batches: list[Batch]) -> int:
    ids = [b.meta.get("pad_token_id") for b in batches]
    if None in ids or len(set(ids)) > 1:
        raise ValueError(
            f"cannot concat batches of different widths: padding {key!r} needs one meta['pad_token_id'], "
            f"the batches have {ids}; build them with completions_to_batch (which sets it) or set it in their meta"
        )
    return ids[0]


def _pad(x: torch.Tensor, left: int, right: int, value: int, repeat_last: bool) -> torch.Tensor:
    if repeat_last and right and x.shape[1]:
        # Right padding holds the row's last position, as cumsum(attention_mask) - 1 lays it out.
        last = x[:, -1:].expand(-1, right, *x.shape[2:])
        x, right = torch.cat([x, last], dim=1), 0
    return torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (left, right), value=value)

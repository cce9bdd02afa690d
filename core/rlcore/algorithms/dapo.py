"""DAPO's data-side pieces (Yu et al. 2025, https://arxiv.org/abs/2503.14476).

*Dynamic sampling*: a group (all responses to one prompt) whose rewards are all equal has zero advantage
under group-relative estimators, so it only dilutes the batch. :func:`filter_groups` drops such groups,
and :class:`DynamicSampler` collects the kept groups over several generation batches until a training
batch is full, up to a limit.

*Overlong reward shaping*: a response longer than ``max_response_length - buffer_len`` tokens loses up to
``penalty_factor`` of reward, linearly over the last ``buffer_len`` tokens (:func:`overlong_penalty`).

Typical use in an algorithm's step::

    sampler = DynamicSampler(num_groups=train_prompts, max_num_gen_batches=10)
    while not sampler.full:
        gen = score(generate(next_prompts()))            # Batch with uid and token_level_scores
        sampler.add(gen, metric=group_metric(gen, "acc"))
    batch = sampler.take()
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import attrs
import torch

from rlcore.api.batch import Batch

logger = logging.getLogger(__name__)


class DynamicSamplingExhausted(RuntimeError):
    """Dynamic sampling reached ``max_num_gen_batches`` without enough groups with varied rewards."""


def group_metric(batch: Batch, metric: str) -> list[float]:
    """Per-sample values of the metric whose spread decides if a group is kept (verl's ``filter_groups.metric``).

    ``"seq_reward"``: sum of ``token_level_scores``; ``"seq_final_reward"``: sum of ``token_level_rewards``
    (after the KL penalty); any other name: a ``[B]`` tensor or per-sample object field of the batch, or a
    key of each sample's ``reward_extra_info`` dict (e.g. ``"acc"`` from a rule scorer).
    """
    derived = {"seq_reward": "token_level_scores", "seq_final_reward": "token_level_rewards"}
    if metric in derived:
        field = derived[metric]
        if field not in batch:
            raise KeyError(
                f"filter metric {metric!r} sums {field!r}, which the batch lacks; fields: {batch.keys()}"
            )
        return batch[field].double().sum(dim=-1).tolist()
    if metric in batch:
        values = batch[metric]
        values = values.tolist() if isinstance(values, torch.Tensor) else list(values)
        return [float(v) for v in values]
    infos = batch.get("reward_extra_info")
    if infos is not None and all(isinstance(i, dict) and metric in i for i in infos):
        return [float(i[metric]) for i in infos]
    raise KeyError(
        f"filter metric {metric!r} is neither 'seq_reward', 'seq_final_reward', a batch field ({batch.keys()}) "
        "nor a key of every sample's reward_extra_info"
    )


def filter_groups(index: Sequence[Any], metric: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """Keep mask ``[B]`` (bool): ``True`` for samples of groups whose ``metric`` values are not all equal.

    ``index``: the group id of each sample (``uid``). A group of one sample is kept (there is nothing to
    compare it with), as in verl. Equality is exact (``max == min``); verl's ``std > 0`` is the same test
    except for float noise.
    """
    values = metric.tolist() if isinstance(metric, torch.Tensor) else list(metric)
    keys = index.tolist() if hasattr(index, "tolist") else list(index)
    if len(values) != len(keys):
        raise ValueError(f"index has {len(keys)} entries but metric has {len(values)}")
    groups: dict[Any, list[float]] = {}
    for key, value in zip(keys, values, strict=True):
        groups.setdefault(key, []).append(float(value))
    varied = {key: len(vals) == 1 or max(vals) != min(vals) for key, vals in groups.items()}
    return torch.tensor([varied[key] for key in keys], dtype=torch.bool)


@attrs.define
class DynamicSampler:
    """Collects groups with varied rewards from successive generation batches.

    ``num_groups``: groups (prompts) one training batch needs. ``max_num_gen_batches``: how many
    generation batches may be drawn for one training batch (``<= 0``: no limit). ``on_exhausted``:
    ``"error"`` raises :class:`DynamicSamplingExhausted` when the limit is reached short of
    ``num_groups`` (verl's behaviour); ``"partial"`` logs a warning and lets :meth:`take` return the
    groups collected so far. ``uid_key``: the per-sample field holding the group id.
    """

    num_groups: int
    max_num_gen_batches: int = 10
    on_exhausted: str = attrs.field(default="error", validator=attrs.validators.in_(("error", "partial")))
    uid_key: str = "uid"
    num_gen_batches: int = attrs.field(default=0, init=False)
    exhausted: bool = attrs.field(default=False, init=False)
    _kept: list[Batch] = attrs.field(factory=list, init=False)
    _groups: list[Any] = attrs.field(factory=list, init=False)
    _seen_groups: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        if self.num_groups < 1:
            raise ValueError(f"DynamicSampler needs num_groups >= 1, got {self.num_groups}")

    @property
    def num_kept_groups(self) -> int:
        return len(self._groups)

    @property
    def full(self) -> bool:
        """Whether :meth:`take` can return a batch (enough groups, or exhausted in ``partial`` mode)."""
        return self.num_kept_groups >= self.num_groups or self.exhausted

    def add(self, batch: Batch, metric: Sequence[float] | torch.Tensor) -> bool:
        """Keep ``batch``'s groups whose ``metric [B]`` varies; return :attr:`full`.

        Raises :class:`DynamicSamplingExhausted` when this was the last allowed generation batch and
        ``on_exhausted == "error"``.
        """
        if self.full:
            raise RuntimeError("DynamicSampler is full: call take() before adding more generation batches")
        if self.uid_key not in batch.objects:
            raise KeyError(
                f"dynamic sampling needs the per-sample group id {self.uid_key!r}; batch has {batch.keys()}"
            )
        uids = batch.objects[self.uid_key]
        keep = filter_groups(uids, metric)
        self.num_gen_batches += 1
        self._seen_groups += len(set(uids))
        if bool(keep.any()):
            kept = batch.index(keep)
            self._kept.append(kept)
            known = set(self._groups)
            for uid in kept.objects[self.uid_key]:
                if uid not in known:
                    known.add(uid)
                    self._groups.append(uid)
        limit = self.max_num_gen_batches
        if self.num_kept_groups < self.num_groups and limit > 0 and self.num_gen_batches >= limit:
            message = (
                f"dynamic sampling kept {self.num_kept_groups} of the {self.num_groups} groups a training batch "
                f"needs after {self.num_gen_batches} generation batches (max_num_gen_batches={limit}); "
                f"{self._seen_groups - self.num_kept_groups} groups had identical rewards for every response. "
                "Raise max_num_gen_batches or the generation batch size, or check that the reward varies "
                "(prompts neither always solved nor never solved)."
            )
            if self.on_exhausted == "error":
                raise DynamicSamplingExhausted(message)
            logger.warning("%s Training on the %d groups collected.", message, self.num_kept_groups)
            self.exhausted = True
        return self.full

    def take(self) -> Batch:
        """The first ``num_groups`` kept groups (all their samples, in arrival order); resets the sampler.

        Generation batches of different prompt and response widths merge into the standard layout
        (:meth:`Batch.concat <rlcore.api.Batch.concat>`)."""
        if not self.full:
            raise RuntimeError(
                f"DynamicSampler has {self.num_kept_groups} of {self.num_groups} groups: add more batches first"
            )
        merged = Batch.concat(self._kept)
        wanted = set(self._groups[: self.num_groups])
        rows = [i for i, uid in enumerate(merged.objects.get(self.uid_key, [])) if uid in wanted]
        out = merged.index(rows)
        out.meta = {**merged.meta, "dynamic_sampling/num_gen_batches": self.num_gen_batches}
        self.num_gen_batches, self.exhausted, self._seen_groups = 0, False, 0
        self._kept, self._groups = [], []
        return out

    def metrics(self) -> dict[str, float]:
        """``dynamic_sampling/num_gen_batches`` and ``dynamic_sampling/kept_group_fraction`` so far."""
        return {
            "dynamic_sampling/num_gen_batches": float(self.num_gen_batches),
            "dynamic_sampling/kept_group_fraction": self.num_kept_groups / self._seen_groups
            if self._seen_groups
            else math.nan,
        }


def overlong_penalty(
    response_length: torch.Tensor | Sequence[int],
    max_response_length: int,
    buffer_len: int,
    penalty_factor: float = 1.0,
) -> torch.Tensor:
    """DAPO's soft overlong punishment ``[B]`` (float32, <= 0) for response lengths ``[B]``.

    ``min(0, -(L - (max_response_length - buffer_len)) / buffer_len * penalty_factor)``: 0 up to
    ``max_response_length - buffer_len`` tokens, falling linearly to ``-penalty_factor`` at
    ``max_response_length``.
    """
    if buffer_len <= 0:
        raise ValueError(f"overlong buffer_len must be > 0, got {buffer_len}")
    if max_response_length < buffer_len:
        raise ValueError(
            f"max_response_length ({max_response_length}) must be >= overlong buffer_len ({buffer_len})"
        )
    length = torch.as_tensor(response_length, dtype=torch.float64)
    expected = max_response_length - buffer_len
    penalty = -(length - expected) / buffer_len * penalty_factor
    return torch.clamp(penalty, max=0.0).to(torch.float32)


def apply_overlong_penalty(
    token_level_scores: torch.Tensor,
    response_mask: torch.Tensor,
    max_response_length: int,
    buffer_len: int,
    penalty_factor: float = 1.0,
    response_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Add :func:`overlong_penalty` to ``token_level_scores [B, T]`` on each row's last valid token.

    The length is ``response_length [B]`` when given, else the number of valid tokens in ``response_mask
    [B, T]``. A multi-turn response passes its whole span (model and tool tokens: what the budget
    ``max_response_length`` counts, as verl's DAPO reward manager measures it from the attention mask),
    while the penalty still lands on the last model token. Returns the new scores and the penalties
    ``[B]``; a row with no valid token is left unchanged.
    """
    if token_level_scores.shape != response_mask.shape:
        raise ValueError(
            f"token_level_scores {tuple(token_level_scores.shape)} and response_mask "
            f"{tuple(response_mask.shape)} differ in shape"
        )
    mask = response_mask.bool()
    lengths = mask.sum(dim=-1) if response_length is None else response_length
    penalty = overlong_penalty(lengths, max_response_length, buffer_len, penalty_factor)
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, -1).amax(dim=-1)
    rows = (last >= 0).nonzero().flatten()
    out = token_level_scores.clone()
    out[rows, last[rows]] += penalty.to(out.device, out.dtype)[rows]
    return out, penalty

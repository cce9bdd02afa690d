"""What a training step reports: phase timings, batch statistics and throughput.

Metric names are ``group/name`` (``timing/generate``, ``reward/mean``, ``actor/pg_clipfrac`` ...), as
verl and TensorBoard group them. Every value is a plain float, so a step's metrics are a JSON line.

Batch statistics (:func:`batch_metrics`) read the standard batch fields (:mod:`rlcore.api.batch`):
``token_level_scores [B, R]`` (reward before the KL penalty), ``token_level_rewards [B, R]`` (after),
``advantages``/``returns``/``values [B, R]`` over the valid tokens of ``response_mask [B, R]``, and
response/prompt lengths from ``response_mask`` and ``attention_mask``.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from rlcore.api import Batch


class PhaseTimer:
    """Wall-clock seconds per phase, summed over repeated entries (DAPO generates several times).

    >>> timer = PhaseTimer()
    >>> with timer("generate"):
    ...     pass
    >>> sorted(timer.metrics())
    ['timing/generate']
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        #: the phase being run now (named in error reports), ``None`` between phases
        self.current: str | None = None

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        outer, self.current = self.current, phase
        start = time.perf_counter()
        try:
            yield
        except BaseException:
            # A failing phase stays named as current, so the error report can say where it happened.
            self._add(phase, start)
            raise
        self._add(phase, start)
        self.current = outer

    def _add(self, phase: str, start: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"timing/{phase}": seconds for phase, seconds in self.seconds.items()}


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    """``mean``/``max``/``min`` of a 1-D tensor (empty: nothing)."""
    if values.numel() == 0:
        return {}
    values = values.double()
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/min": float(values.min()),
    }


def batch_metrics(batch: Batch, max_response_length: int | None = None) -> dict[str, float]:
    """Reward, advantage, return, value and length statistics of a step's final batch.

    Sequence rewards are row sums: ``reward/*`` of ``token_level_scores``, ``reward/final_*`` of
    ``token_level_rewards`` (only when it differs, i.e. with a KL penalty in the reward). Token-level
    tensors are summarised over the valid response tokens. ``response_length/clip_ratio`` is the
    fraction of responses that reached ``max_response_length``; ``tokens/total`` and ``tokens/response``
    count the batch's tokens (throughput is derived from them).
    """
    mask = batch["response_mask"].bool()
    metrics: dict[str, float] = {}
    if "token_level_scores" in batch:
        scores = batch["token_level_scores"].double().sum(-1)
        metrics.update(_stats("reward", scores))
        metrics["reward/std"] = float(scores.std()) if scores.numel() > 1 else 0.0
    if "token_level_rewards" in batch and "token_level_scores" in batch:
        if not torch.equal(batch["token_level_rewards"], batch["token_level_scores"]):
            metrics.update(_stats("reward/final", batch["token_level_rewards"].double().sum(-1)))
    for key in ("advantages", "returns", "values"):
        # Outcome estimators return advantages as returns: report them once.
        if key in batch and not (key == "returns" and torch.equal(batch[key], batch.get("advantages"))):
            metrics.update(_stats(key, batch[key][mask]))
    lengths = mask.sum(-1).double()
    metrics.update(_stats("response_length", lengths))
    # A multi-turn response also holds tool tokens (response_mask 0, attention_mask 1): the budget and the
    # prompt's length count them apart from the model's tokens.
    spans = lengths
    if "attention_mask" in batch and "responses" in batch:
        spans = batch["attention_mask"][:, -batch["responses"].shape[1] :].sum(-1).double()
    if max_response_length:
        metrics["response_length/clip_ratio"] = float((spans >= max_response_length).double().mean())
    if "attention_mask" in batch:
        prompt_lengths = batch["attention_mask"].sum(-1).double() - spans
        metrics["prompt_length/mean"] = float(prompt_lengths.mean())
    total, response = token_counts(batch)
    metrics["tokens/total"], metrics["tokens/response"] = float(total), float(response)
    return metrics


def token_counts(batch: Batch) -> tuple[int, int]:
    """``(all tokens, response tokens)`` of a batch: prompt + response tokens, and response tokens."""
    response = int(batch["response_mask"].sum())
    total = int(batch["attention_mask"].sum()) if "attention_mask" in batch else response
    return total, response


def throughput(
    total_tokens: int, response_tokens: int, step_s: float, generate_s: float | None
) -> dict[str, float]:
    """``perf/tokens_per_s`` (all tokens of the step over its wall time) and
    ``perf/generate_tokens_per_s`` (response tokens over the generation phase)."""
    out = {"perf/tokens_per_s": total_tokens / step_s if step_s > 0 else math.nan}
    if generate_s:
        out["perf/generate_tokens_per_s"] = response_tokens / generate_s
    return out


def prefixed(role: str, metrics: Mapping[str, Any]) -> dict[str, float]:
    """Engine metrics of a role (``loss``, ``grad_norm``, ``lr``) under ``role/``; keys that already
    name a group (``actor/pg_loss``) are kept."""
    return {k if "/" in k else f"{role}/{k}": float(v) for k, v in metrics.items()}


def mean_by(keys: list[Any], values: list[float]) -> dict[Any, float]:
    """Mean of ``values`` per key (validation reward per data source)."""
    sums: dict[Any, float] = {}
    counts: dict[Any, int] = {}
    for k, v in zip(keys, values, strict=True):
        sums[k] = sums.get(k, 0.0) + float(v)
        counts[k] = counts.get(k, 0) + 1
    return {k: sums[k] / counts[k] for k in sums}

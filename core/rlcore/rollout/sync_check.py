"""The post-sync check: do the rollout and the trainer agree on log-probs after a weight sync?

After new weights reach a rollout engine, generate a few responses from a small probe batch
(:func:`~rlcore.rollout.batching.completions_to_batch` builds it, with ``rollout_log_probs``), have the
train engine compute ``log_probs`` for the same tokens (``TrainEngine.infer``), and compare::

    batch = completions_to_batch(rollout.generate(probe_prompts, params), pad_token_id)
    trainer = actor.infer(batch, ["log_probs"])
    metrics = compare_log_probs(batch["rollout_log_probs"], trainer["log_probs"], batch["response_mask"],
                                threshold=0.02, train_engine="fsdp", rollout_engine="vllm")

Measured on the tiny model (FINDINGS.md): matching fp32 engines differ by about 1e-5 on average; a bf16
rollout against an fp32 trainer by 0.13-0.23; a stale prefix cache or a missing ``lm_head`` copy by ~2.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from rlcore.algorithms.mismatch import mismatch_metrics

CAUSES = (
    "rollout and trainer dtypes differ (rollout.dtype vs the trainer's; vLLM defaults fp32 checkpoints to bf16)",
    "the rollout kept a prefix/KV cache computed with the old weights (reset it after every load)",
    "with tied embeddings the rollout keeps its own lm_head copy that was not sent (export lm_head.weight)",
    "the sampling temperature differs from the trainer's (log-probs are of logits / temperature)",
    "part of the weight stream was not applied (names mapped to nothing, or a partial stream)",
    "the rollout engine reports other log-probs than the sampled tokens' log_softmax(logits / temperature) "
    "(run its plugin's contract suite: rlcore.testing.contract.RolloutEngineContract)",
)


class WeightSyncMismatch(RuntimeError):
    """Rollout and trainer log-probs disagree beyond the configured threshold after a weight sync."""


def compare_log_probs(
    rollout_log_probs: Sequence[Sequence[float]] | torch.Tensor,
    trainer_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    threshold: float | None = None,
    train_engine: str = "'trainer'",
    rollout_engine: str = "'rollout'",
) -> dict[str, float]:
    """The mismatch metrics of the rollout's and the trainer's log-probs over the response tokens, in
    float64 (:func:`rlcore.algorithms.mismatch.mismatch_metrics`).

    ``trainer_log_probs [B, R]`` and ``response_mask [B, R]`` (1 on tokens that count). The rollout's
    log-probs come as a ``[B, R]`` tensor in the same layout (padding ignored) or as ``B`` lists holding
    the values of row ``b``'s masked positions in order (``Completion.log_probs``).

    Returns, each under ``sync/``: ``logprob_diff_mean`` (mean absolute difference over masked tokens),
    ``logprob_diff_p50``, ``_p90``, ``_p99`` and ``_max`` (its quantiles and maximum),
    ``mismatch_k3_kl`` (the k3 estimate of KL(rollout || trainer)) and ``mismatch_ppl_ratio`` (trainer
    over rollout perplexity, averaged over sequences), ``logprob_diff_trimmed`` (:func:`trimmed_mean`, the
    calibrated check's statistic) and ``probe_tokens``. With a
    ``threshold``, a mean difference above it raises :class:`WeightSyncMismatch` naming both engines,
    the size of the gap, the worst token, and the usual causes. ``train_engine`` and ``rollout_engine``
    name the engines in that message as given (the run passes ``'vllm' (plugin 'vllm')``).
    """
    trainer = trainer_log_probs.detach().to("cpu", torch.float64)
    mask = response_mask.detach().to("cpu").bool()
    if trainer.shape != mask.shape or trainer.dim() != 2:
        raise ValueError(
            f"compare_log_probs: trainer_log_probs {tuple(trainer.shape)} and response_mask "
            f"{tuple(mask.shape)} must both be [B, R]"
        )
    rollout = _rollout_tensor(rollout_log_probs, mask)
    if not mask.any():
        raise ValueError("compare_log_probs: response_mask selects no token; the probe batch is empty")
    metrics = {f"sync/{k}": v for k, v in mismatch_metrics(rollout, trainer, mask).items()}
    metrics["sync/logprob_diff_trimmed"] = trimmed_mean((rollout - trainer).abs()[mask])
    metrics["sync/probe_tokens"] = float(mask.sum())
    worst = int((rollout - trainer).abs().masked_fill(~mask, 0.0).argmax())
    row, col = divmod(worst, mask.shape[1])
    if threshold is not None and metrics["sync/logprob_diff_mean"] > threshold:
        causes = "\n".join(f"  - {c}" for c in CAUSES)
        raise WeightSyncMismatch(
            f"after the weight sync, rollout {rollout_engine} and train engine {train_engine} disagree on "
            f"log-probs: mean |difference| {metrics['sync/logprob_diff_mean']:.4g} over {int(mask.sum())} "
            f"tokens exceeds the threshold {threshold:g} (max {metrics['sync/logprob_diff_max']:.4g} at row "
            f"{row}, token {col}: rollout {float(rollout[row, col]):.4f} vs trainer "
            f"{float(trainer[row, col]):.4f}). Usual causes:\n{causes}"
        )
    return metrics


def _rollout_tensor(values: Sequence[Sequence[float]] | torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The rollout's log-probs as a float64 ``[B, R]`` tensor laid out like ``mask``."""
    if isinstance(values, torch.Tensor):
        if values.shape != mask.shape:
            raise ValueError(
                f"compare_log_probs: rollout_log_probs {tuple(values.shape)} and response_mask "
                f"{tuple(mask.shape)} differ in shape"
            )
        return values.detach().to("cpu", torch.float64)
    if len(values) != mask.shape[0]:
        raise ValueError(
            f"compare_log_probs: {len(values)} rows of rollout log-probs for a batch of {mask.shape[0]}"
        )
    out = torch.zeros(mask.shape, dtype=torch.float64)
    for b, row in enumerate(values):
        count = int(mask[b].sum())
        if len(row) != count:
            raise ValueError(
                f"compare_log_probs: row {b} has {len(row)} rollout log-probs but {count} masked tokens"
            )
        out[b, mask[b]] = torch.as_tensor(list(row), dtype=torch.float64)
    return out


# --- the calibrated check -------------------------------------------------------------------------------

#: Samples the post-sync check draws per probe prompt: 2 prompts x 8 samples x 16 tokens = 256 tokens, so
#: the trimmed mean of |difference| moves by about 10% between probes of a healthy pair (bf16 on
#: SmolLM2: per-token |difference| has a standard deviation about 1.5 times its mean, 1.5 / sqrt(256)),
#: against 30% on the 22-32 tokens of one sample per prompt (docs/benchmarks.md).
PROBE_SAMPLES = 8

#: Share of the largest |differences| the check's statistic drops: one token of 256 an engine's kernels
#: round the other way near a tie moves the plain mean by up to 0.002 (bf16), the trimmed one not at all.
TRIM = 0.01


def trimmed_mean(values: torch.Tensor) -> float:
    """Mean of ``values`` (1-D) without its largest :data:`TRIM` share (none below 100 values)."""
    keep = values.numel() - int(values.numel() * TRIM)
    return float(values.sort().values[:keep].mean())


@attrs.define(frozen=True)
class SyncFloor:
    """The pair's own numerical floor: the check's statistic (:func:`trimmed_mean` of |rollout - trainer|
    log-prob) when both held the same weights (the initial sync, before any update), over ``tokens``."""

    value: float
    tokens: int


def sync_bound(floor: float, *, factor: float, margin: float, cap: float) -> float:
    """What a later sync may reach: ``min(max(factor * floor, floor + margin), cap)``."""
    return min(max(factor * floor, floor + margin), cap)


def gap_shape(
    rollout_log_probs: torch.Tensor, trainer_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """The shape of the signed gap ``d = rollout - trainer`` over the masked tokens (``[B, R]`` each), in
    float64, as the diagnosis reads it:

    - ``above_share``: the share of the tokens that differ by more than noise (|d| above
      ``max(1e-3, 0.1 * mean |d|)``) where the rollout is above; ``differing`` counts them. An engine
      reporting the argmax token's log-prob is above wherever it differs (the share is 1); healthy noise
      is two-sided;
    - ``slope``: the least-squares slope of ``d`` on the trainer's log-prob. An engine ignoring the
      temperature reports ``log_softmax(z)[y] = T * log_softmax(z / T)[y] + c`` with ``c`` near 0 where
      the sampled token dominates, so its slope is near ``T - 1``; healthy noise does not grow with how
      unlikely the token is, and its slope is near 0.
    """
    mask = response_mask.detach().to("cpu").bool()
    trainer = trainer_log_probs.detach().to("cpu", torch.float64)[mask]
    signed = rollout_log_probs.detach().to("cpu", torch.float64)[mask] - trainer
    tol = max(1e-3, 0.1 * float(signed.abs().mean())) if signed.numel() else 1e-3
    differing = signed[signed.abs() > tol]
    above = float((differing > 0).double().mean()) if differing.numel() else 0.0
    centred = trainer - trainer.mean()
    spread = float((centred * centred).sum())
    slope = float((centred * signed).sum()) / spread if spread > 0 else 0.0
    return {"above_share": above, "differing": float(differing.numel()), "slope": slope}


#: The shape tests that stop a run whatever the bound (:func:`shape_mistake`), from
#: ``benchmarks/sync_check_floor_smollm2.py`` (SmolLM2, 241-256 probe tokens, seeds 0-2, fp32 and bf16
#: rollouts against an fp32 trainer; docs/concepts.md). The argmax engine: above on 92-100% of the
#: differing tokens, slope -0.75 to -0.88 (it reports about 0 where the trainer says log p); a healthy
#: bf16 pair at its initial sync: above on 46-62%, slope -0.011 to +0.001. The temperature-ignoring engine
#: at T=0.7: slope 0.44-0.68 of ``T - 1``.
ARGMAX_ABOVE_SHARE = 0.8
ARGMAX_SLOPE = -0.4
TEMPERATURE_SLOPE_SHARE = 0.25
#: The trimmed mean |difference| below which no shape stops a run. Late in training a healthy pair's
#: tiny gap can take a temperature-like slope: FSDP + SGLang on SmolLM2 at step 20 (entropy 0.06), a gap
#: of 0.00066 with a slope of 0.31 of ``T - 1`` (and 0.0026 with merged LoRA weights), stopped by a check
#: without this floor (docs/benchmarks.md). The wrong engines' gaps were 0.17-1.13, healthy pairs' 0.07 at
#: most (SGLang bf16, GPU).
SHAPE_MIN_GAP = 0.1
#: What a healthy FP8 rollout gave at its initial sync, both sides on the same weights: SGLang
#: (``rollout.quantization: fp8``, bf16 activations) against an fp32 FSDP trainer on SmolLM2 at T=0.7, one
#: H200 (docs/benchmarks.md, issue 53): trimmed mean |difference| 0.2048 over 233 tokens, slope -0.129, 0.43
#: of ``T - 1``: above :data:`TEMPERATURE_SLOPE_SHARE`, within the temperature-ignoring engine's 0.44-0.68.
QUANTIZED_SLOPE = -0.129
#: Differing tokens a shape test needs: fewer say nothing about a shape (a healthy fp32 pair has none).
MIN_DIFFERING = 16


def shape_mistake(
    shape: dict[str, float], *, value: float, temperature: float, filtered: bool, quantized: bool = False
) -> str | None:
    """The known mistake whose *shape* the gap has (:func:`gap_shape`), or ``None``; ``value`` is the
    check's statistic (the trimmed mean |difference|), which must reach :data:`SHAPE_MIN_GAP`.

    A healthy pair's differences of that size are two-sided and do not grow with how unlikely the token
    is, in bf16 as in fp32. The shapes are tested only without top-k/top-p (``filtered``), whose
    renormalised log-probs are above the trainer's by design. With a quantized rollout (``quantized``:
    ``rollout.quantization``) the temperature shape is not tested: the rollout samples the tokens its
    FP8 noise made likelier, the less likely the token the more so, which is that shape
    (:data:`QUANTIZED_SLOPE`); the argmax shape is still tested."""
    if filtered or shape["differing"] < MIN_DIFFERING or value < SHAPE_MIN_GAP:
        return None
    if shape["above_share"] >= ARGMAX_ABOVE_SHARE and shape["slope"] <= ARGMAX_SLOPE:
        return (
            f"the rollout's log-probs are above the trainer's on {shape['above_share']:.0%} of the "
            f"{int(shape['differing'])} tokens where they differ by more than noise, more so the less likely "
            f"the token (slope {shape['slope']:+.3f}): the gap matches an engine that reports the log-prob of the most likely token (argmax), not of the sampled one"
        )
    if quantized:
        return None
    if temperature not in (0.0, 1.0) and shape["slope"] / (temperature - 1.0) >= TEMPERATURE_SLOPE_SHARE:
        return (
            f"at temperature {temperature:g} the gap grows with how unlikely the token is (slope "
            f"{shape['slope']:+.3f} on the trainer's log-prob, {shape['slope'] / (temperature - 1):.2f} of "
            f"T - 1 = {temperature - 1:+.2g}; a healthy pair's is near 0): the gap matches an engine that ignores "
            f"the temperature in its log-probs (log_softmax(z) instead of log_softmax(z / {temperature:g}))"
        )
    return None


def diagnose(
    shape: dict[str, float],
    *,
    temperature: float,
    filtered: bool,
    rollout_dtype: str,
    train_dtype: str,
    dtype_gap: tuple[float, float],
    value: float,
    quantized: bool = False,
) -> str | None:
    """Which known mistake the gap matches, when one does; ``None`` otherwise: a shape mistake
    (:func:`shape_mistake`: argmax, temperature) first; else a gap of the size a bf16-against-fp32 pair
    gives (``dtype_gap``: low, high)."""
    found = shape_mistake(shape, value=value, temperature=temperature, filtered=filtered, quantized=quantized)
    if found is not None:
        return found
    low, high = dtype_gap
    if low <= value <= high:
        pair = f"rollout {rollout_dtype}, trainer {train_dtype}"
        if rollout_dtype == train_dtype:
            return (
                f"the gap is of the size a bf16 engine against an fp32 one gives ({low:g}-{high:g}) while both "
                f"are configured {rollout_dtype} ({pair}): does one engine compute in bf16 (vLLM defaults fp32 "
                "checkpoints to bf16; rollout.dtype)?"
            )
        return f"the gap is of the size a dtype difference gives ({pair}: {low:g}-{high:g})"
    if filtered:
        return (
            "top-k/top-p sampling: the rollout reports log-probs renormalised over the kept tokens, the "
            "trainer over the whole vocabulary"
        )
    return None


def check_against_floor(
    metrics: dict[str, float],
    rollout_log_probs: torch.Tensor,
    trainer_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    floor: SyncFloor | None,
    bound: float,
    diagnosis: str | None,
    mistake: str | None = None,
    train_engine: str,
    rollout_engine: str,
) -> None:
    """Raise :class:`WeightSyncMismatch` when ``metrics['sync/logprob_diff_trimmed']`` exceeds ``bound``,
    or when the gap has a known mistake's shape (``mistake``, :func:`shape_mistake`) whatever its size,
    saying floor, bound and value, the worst token, the matching mistake (``diagnosis``) or else the
    usual causes. ``floor`` is ``None`` at the sync that measures it (the value is then the floor, and the
    bound the absolute cap)."""
    value = metrics["sync/logprob_diff_trimmed"]
    if value <= bound and mistake is None:
        return
    mask = response_mask.detach().to("cpu").bool()
    rollout = rollout_log_probs.detach().to("cpu", torch.float64)
    trainer = trainer_log_probs.detach().to("cpu", torch.float64)
    worst = int((rollout - trainer).abs().masked_fill(~mask, 0.0).argmax())
    row, col = divmod(worst, mask.shape[1])
    tokens = int(mask.sum())
    if value <= bound:
        where = (
            f"the trimmed mean |difference| {value:.4g} over {tokens} tokens is within the bound {bound:.4g}, "
            "but the gap has the shape of a known mistake, which no dtype's noise has"
        )
    elif floor is None:
        where = (
            f"at the initial sync (both on the same weights) their floor, the trimmed mean |difference| "
            f"{value:.4g} over {tokens} tokens, exceeds the bound {bound:g} (the absolute cap of the dtype)"
        )
    else:
        where = (
            f"the trimmed mean |difference| {value:.4g} over {tokens} tokens exceeds the bound {bound:.4g} "
            f"(floor {floor.value:.4g} over {floor.tokens} tokens at the initial sync)"
        )
    if mistake is not None or diagnosis is not None:
        why = f"Diagnosis: {mistake if mistake is not None else diagnosis}."
    else:
        causes = "\n".join(f"  - {c}" for c in CAUSES)
        why = f"Usual causes:\n{causes}"
    raise WeightSyncMismatch(
        f"after the weight sync, rollout {rollout_engine} and train engine {train_engine} disagree on "
        f"log-probs: {where} (mean {metrics['sync/logprob_diff_mean']:.4g}, max "
        f"{metrics['sync/logprob_diff_max']:.4g} at row {row}, token {col}: rollout "
        f"{float(rollout[row, col]):.4f} vs trainer {float(trainer[row, col]):.4f}). {why}"
    )

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
    over rollout perplexity, averaged over sequences). With a
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

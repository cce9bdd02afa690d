"""Training-inference mismatch: how far the rollout engine's log-probs of the sampled tokens are from the
trainer's log-probs of the same tokens under the same weights.

The two engines compute one function in different kernels, precisions and batch layouts, so they never
agree exactly; a policy gradient taken on the rollout's samples with the trainer's probabilities is then
slightly off-policy (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
training"; Liu, Li et al. 2025, "When speed kills stability"). These numbers say by how much, per step.
With ``log r = log p_trainer - log p_rollout`` per response token (the tokens were sampled by the rollout):

================================  ==================================================================
metric                            definition (over the tokens where ``mask`` is 1)
================================  ==================================================================
``logprob_diff_mean``             mean ``|log r|``
``logprob_diff_p50|p90|p99|max``  quantiles of ``|log r|`` (linear interpolation between order
                                  statistics, numpy's default) and its maximum
``mismatch_k3_kl``                mean ``(r - 1) - log r``: Schulman's k3 estimate of
                                  KL(rollout || trainer) from rollout samples; never negative, 0 only
                                  when the engines agree on every token (verl's ``mismatch_k3_kl``,
                                  ``rollout_corr/k3_kl``)
``mismatch_ppl_ratio``            trainer perplexity / rollout perplexity per sequence,
                                  ``exp(mean_t (log p_rollout - log p_trainer))``, averaged over the
                                  sequences with a response token (verl's ``ppl_ratio``); 1 when they
                                  agree, above 1 when the trainer finds the samples less likely
``mismatch_seq_ratio_max``        the largest sequence-level importance weight
                                  ``exp(sum_t log r)`` = ``p_trainer(y) / p_rollout(y)`` of a
                                  response (the weight ``tis`` at ``is_level: sequence`` uses)
``mismatch_seq_over_cap``         the share of responses whose sequence-level weight exceeds
                                  :data:`SEQUENCE_CAP` (3): what sequence-level masking at 3,
                                  TRL's default rollout correction, would drop
================================  ==================================================================

:func:`mismatch_means` holds the means alone (difference, k3, perplexity ratio), the ones that stay
meaningful when a train engine averages a loss's metrics over micro-batches;
:func:`mismatch_metrics` adds the quantiles, maximum and sequence-level numbers, which need every token
of the batch at once.
Both compute in float64 whatever the inputs' dtype.

>>> import torch
>>> m = mismatch_metrics(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.0, -2.5]]), torch.tensor([[1, 1]]))
>>> round(m["logprob_diff_mean"], 4), round(m["logprob_diff_max"], 4), round(m["mismatch_k3_kl"], 4)
(0.25, 0.5, 0.0533)
"""

from __future__ import annotations

import math
from typing import Any

import torch

#: The quantiles of ``|log r|`` :func:`mismatch_metrics` reports, as ``logprob_diff_p<100 q>``.
QUANTILES = (0.5, 0.9, 0.99)
#: The sequence-level weight ``mismatch_seq_over_cap`` counts responses above: TRL's
#: ``vllm_importance_sampling_cap`` with its default ``sequence_mask`` mode.
SEQUENCE_CAP = 3.0


def _log_ratio(
    rollout: torch.Tensor, trainer: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log r, keep)``: ``log p_trainer - log p_rollout`` in float64, 0 off the mask (so padding never
    reaches ``exp``), and the mask as booleans, both on the trainer's device."""
    if not (rollout.shape == trainer.shape == mask.shape) or mask.dim() != 2:
        raise ValueError(
            f"mismatch metrics: rollout {tuple(rollout.shape)}, trainer {tuple(trainer.shape)} log-probs "
            f"and mask {tuple(mask.shape)} must all be [B, R]"
        )
    keep = mask.detach().to(trainer.device).bool()
    log_r = trainer.detach().to(torch.float64) - rollout.detach().to(trainer.device, torch.float64)
    return log_r.masked_fill(~keep, 0.0), keep


def mismatch_means(rollout: torch.Tensor, trainer: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """``logprob_diff_mean``, ``mismatch_k3_kl`` and ``mismatch_ppl_ratio`` (module docstring) of the
    rollout's and trainer's log-probs ``[B, R]`` of the sampled tokens, over ``mask [B, R]`` (1 on
    response tokens); ``{}`` when the mask selects no token."""
    log_r, keep = _log_ratio(rollout, trainer, mask)
    tokens = keep.sum()
    if not bool(tokens):
        return {}
    # Summed as (r - 1) - log r: for a tiny gap r - 1 and log r nearly cancel, and expm1 keeps the digits.
    k3 = (torch.expm1(log_r) - log_r).sum() / tokens
    per_row = keep.sum(dim=1)
    rows = per_row > 0
    log_ppl_ratio = -log_r.sum(dim=1)[rows] / per_row[rows]
    return {
        "logprob_diff_mean": float(log_r.abs().sum() / tokens),
        "mismatch_k3_kl": float(k3),
        "mismatch_ppl_ratio": float(torch.exp(log_ppl_ratio).mean()),
    }


def mismatch_metrics(rollout: torch.Tensor, trainer: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """:func:`mismatch_means` plus ``logprob_diff_p50``, ``_p90``, ``_p99`` and ``_max`` of ``|log r|``
    over the masked tokens, and ``mismatch_seq_ratio_max`` and ``mismatch_seq_over_cap`` over the
    responses with a token; ``{}`` when the mask selects no token."""
    metrics = mismatch_means(rollout, trainer, mask)
    if not metrics:
        return metrics
    log_r, keep = _log_ratio(rollout, trainer, mask)
    # A sort rather than torch.quantile, which refuses inputs over 16M elements (a large batch's tokens).
    diffs = log_r.abs()[keep].sort().values
    for q in QUANTILES:
        metrics[f"logprob_diff_p{round(100 * q)}"] = float(sorted_quantile(diffs, q))
    metrics["logprob_diff_max"] = float(diffs[-1])
    rows = keep.any(dim=1)
    seq_log_ratio = log_r.sum(dim=1)[rows]
    metrics["mismatch_seq_ratio_max"] = float(torch.exp(seq_log_ratio.max()))
    metrics["mismatch_seq_over_cap"] = float((seq_log_ratio > math.log(SEQUENCE_CAP)).double().mean())
    return metrics


def sorted_quantile(values: Any, q: float) -> Any:
    """The ``q`` quantile of ``values`` (sorted ascending: a list or a 1-d tensor, not empty) by linear
    interpolation between the order statistics around ``q (n - 1)``, as numpy's default."""
    last = len(values) - 1
    position = q * last
    low = int(position)
    high = min(low + 1, last)
    return values[low] + (position - low) * (values[high] - values[low])

"""Off-policy correction: how far a trained sample's behaviour policy lags the policy being updated, and the
importance weights that correct for it.

Three policies meet in an asynchronous update (Hilton et al. 2022, "Batch size-invariance for policy
optimization"; AReaL's decoupled PPO, Fu et al. 2025):

* the **behaviour** policy sampled the tokens (``rollout_log_probs [B, R]``, recorded by the rollout, per
  token under the weights that sampled it, ``policy_version [B, R]``);
* the **proximal** policy is the actor's weights before this update (``old_log_probs [B, R]``, the
  old-log-prob pass); PPO's ratio and clip are centred on it;
* the policy being trained (the loss's ``log_probs``).

:func:`importance_weights` turns proximal and behaviour log-probs into ``rollout_is_weights [B, R]``, which
every policy loss multiplies into its per-token loss (:mod:`rlcore.algorithms.policy_losses`):

============  ====================================================================================
correction    weights
============  ====================================================================================
``none``      none: the proximal policy is taken as the behaviour one (biased once samples are stale)
``behaviour`` none, and the ratio is centred on the behaviour policy (``old_log_probs`` :=
              ``rollout_log_probs``; no old-log-prob pass): plain PPO on stale samples
``decoupled`` ``pi_prox / pi_behav`` per token; tokens whose weight exceeds ``cap`` are dropped (weight 0),
              AReaL's ``behav_imp_weight_cap``; no cap: untruncated
``tis``       truncated importance sampling (Yao et al. 2025; verl's ``rollout_is``): ``min(w, cap)``
              with ``w`` per token, or per sequence (``exp(sum log w)``) with ``level: sequence``
``mask``      no reweighting: weight 1, and 0 for the sequences (``level: sequence``) or tokens whose
              ``w`` exceeds ``cap`` (TRL's ``vllm_importance_sampling_mode: sequence_mask``, cap 3)
============  ====================================================================================
"""

from __future__ import annotations

import torch

from rlcore.algorithms.aggregation import masked_mean

#: The correction options (``algorithm.off_policy``), ``auto`` aside.
CORRECTIONS = ("none", "behaviour", "decoupled", "tis", "mask")
#: ``algorithm.is_level`` options.
IS_LEVELS = ("token", "sequence")


def importance_weights(
    proximal: torch.Tensor,
    behaviour: torch.Tensor,
    mask: torch.Tensor,
    *,
    correction: str,
    cap: float | None,
    level: str = "token",
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """``rollout_is_weights [B, R]`` (0 where ``mask`` is 0) for ``correction`` ``decoupled``, ``tis`` or
    ``mask``,
    ``None`` for ``none`` and ``behaviour``; and metrics over the masked tokens:
    ``off_policy/is_weight_mean|max|min`` (before truncation) and ``off_policy/is_clipped_fraction`` (the
    share of tokens, or of sequences at ``level: sequence``, whose weight the cap changed).

    ``proximal``, ``behaviour``: log-probs ``[B, R]`` of the sampled tokens; ``mask``: ``[B, R]``, 1 on
    model tokens. The weights are computed in float64 and returned in ``proximal``'s dtype.
    """
    if correction not in CORRECTIONS:
        raise ValueError(
            f"algorithm.off_policy must be auto or one of {', '.join(CORRECTIONS)}, got {correction!r}"
        )
    if level not in IS_LEVELS:
        raise ValueError(f"algorithm.is_level must be one of {', '.join(IS_LEVELS)}, got {level!r}")
    if correction in ("none", "behaviour"):
        return None, {}
    m = mask.to(torch.float64)
    log_w = (proximal.to(torch.float64) - behaviour.to(torch.float64)) * m
    if correction in ("tis", "mask") and level == "sequence":
        # One weight per sequence: the product of its token ratios, broadcast over its tokens.
        log_w = log_w.sum(-1, keepdim=True).expand_as(log_w) * m
    raw = torch.exp(log_w)
    if cap is None:
        weights, changed = raw, torch.zeros_like(raw, dtype=torch.bool)
    elif correction == "tis":
        weights, changed = raw.clamp(max=cap), raw > cap
    elif correction == "mask":  # drop what is too far off, reweight nothing else
        changed = raw > cap
        weights = (~changed).to(raw.dtype)
    else:  # decoupled: drop the tokens whose behaviour probability is too far below the proximal one
        changed = raw > cap
        weights = torch.where(changed, torch.zeros_like(raw), raw)
    weights = weights * m
    valid = mask.bool()
    values = raw[valid]
    metrics: dict[str, float] = {}
    if values.numel():
        if level == "sequence" and correction in ("tis", "mask"):
            rows = valid.any(-1)
            clipped = float(changed[:, 0][rows].double().mean()) if rows.any() else 0.0
        else:
            clipped = float(masked_mean(changed.to(torch.float64), m))
        metrics = {
            "off_policy/is_weight_mean": float(values.mean()),
            "off_policy/is_weight_max": float(values.max()),
            "off_policy/is_weight_min": float(values.min()),
            "off_policy/is_clipped_fraction": clipped,
        }
    return weights.to(proximal.dtype), metrics


def version_span(versions: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(oldest, newest)`` ``[B]`` int64: each row's oldest and newest policy version over its model
    tokens (``versions [B, R]``, ``mask [B, R]``); a row without model tokens has ``oldest`` = int64 max
    and ``newest`` = -1."""
    valid = mask.bool()
    oldest = (
        torch.where(valid, versions, torch.full_like(versions, torch.iinfo(torch.long).max)).min(-1).values
    )
    newest = torch.where(valid, versions, torch.full_like(versions, -1)).max(-1).values
    return oldest, newest


def staleness(versions: torch.Tensor, mask: torch.Tensor, trainer_version: int) -> torch.Tensor:
    """``[B]`` int64: how many policy versions each sample lags the one being updated, by its oldest
    model token (``versions [B, R]``, ``mask [B, R]``). A row without model tokens lags 0."""
    oldest, newest = version_span(versions, mask)
    oldest = torch.where(newest < 0, torch.full_like(oldest, trainer_version), oldest)
    return (trainer_version - oldest).clamp(min=0)


def staleness_metrics(versions: torch.Tensor, mask: torch.Tensor, trainer_version: int) -> dict[str, float]:
    """``off_policy/staleness_mean|max``, ``off_policy/staleness/<k>`` (the share of samples lagging
    ``k`` versions: the histogram) and ``off_policy/multi_version_fraction`` (the share of samples whose
    tokens came from more than one version: continued partial rollouts)."""
    lag = staleness(versions, mask, trainer_version)
    oldest, newest = version_span(versions, mask)
    spans = (newest > oldest) & (newest >= 0)
    metrics = {
        "off_policy/staleness_mean": float(lag.double().mean()),
        "off_policy/staleness_max": float(lag.max()),
        "off_policy/multi_version_fraction": float(spans.double().mean()),
    }
    for k in range(int(lag.max()) + 1):
        metrics[f"off_policy/staleness/{k}"] = float((lag == k).double().mean())
    return metrics

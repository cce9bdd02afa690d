"""Policy losses: pure functions returning ``(loss, metrics)``.

Every loss takes verl's arguments ``old_log_prob, log_prob, advantages, response_mask`` (each ``[B, T]``;
``log_prob`` carries the gradient), ``loss_agg_mode`` and the clip parameters ``clip_ratio``,
``clip_ratio_low``, ``clip_ratio_high`` (each defaulting to ``clip_ratio``) and ``clip_ratio_c``, plus
the global-batch counts of :func:`rlcore.algorithms.aggregation.agg_loss` (``global_tokens``,
``global_sequences``, ``loss_scale_factor``) and optional ``rollout_is_weights [B, T]`` (importance
weights for a rollout/trainer mismatch, multiplied into the per-token loss). A loss ignores the clip
parameters it has no use for, so a caller can pass the same arguments to any of them.

Notation: ``r = exp(log_prob - old_log_prob)`` per token, ``A`` the advantage, ``eps_low`` /
``eps_high`` the clip ratios. Losses are computed in at least float32 (bf16 log-probs give a float32 loss
whose gradient flows back in bf16). Masked tokens never contribute, not even NaN or inf log-probs there.

Metrics are floats over this batch alone (a micro-batch's own mean, not its share of the mini-batch
loss), under verl's keys: ``actor/pg_loss`` (the loss as if this batch were the whole batch),
``actor/pg_clipfrac`` (fraction of valid tokens clipped), ``actor/ppo_kl`` (mean of ``old_log_prob -
log_prob``), ``actor/pg_clipfrac_lower`` (dual-clip fraction).
"""

from __future__ import annotations

import torch

from rlcore.algorithms.aggregation import agg_loss, masked_mean

Counts = int | float | torch.Tensor | None


def _clip_range(clip_ratio: float, low: float | None, high: float | None) -> tuple[float, float]:
    low = clip_ratio if low is None else low
    high = clip_ratio if high is None else high
    if low < 0 or high < 0:
        raise ValueError(f"clip ratios must be >= 0, got clip_ratio_low={low}, clip_ratio_high={high}")
    return low, high


def _prepare(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Shape checks, upcast, and zeros on masked tokens: ``(log_ratio, log_prob, advantages, mask)``."""
    for name, t in (
        ("old_log_prob", old_log_prob),
        ("advantages", advantages),
        ("response_mask", response_mask),
    ):
        if t.shape != log_prob.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, but log_prob has {tuple(log_prob.shape)}")
    if log_prob.dim() != 2:
        raise ValueError(f"log_prob must be [B, T], got shape {tuple(log_prob.shape)}")
    mask = response_mask.bool()
    dtype = torch.promote_types(torch.promote_types(log_prob.dtype, old_log_prob.dtype), torch.float32)
    zero = torch.zeros((), dtype=dtype, device=log_prob.device)
    # Zero masked entries *before* any exp: torch.where cannot stop a NaN gradient from exp(inf) behind it.
    lp = torch.where(mask, log_prob.to(dtype), zero)
    old = torch.where(mask, old_log_prob.to(dtype).detach(), zero)
    adv = torch.where(mask, advantages.to(dtype).detach(), zero)
    return lp - old, lp, adv, mask


def _aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    loss_agg_mode: str,
    global_tokens: Counts,
    global_sequences: Counts,
    loss_scale_factor: float | None,
) -> tuple[torch.Tensor, float]:
    """The loss normalised by the global counts, and (as a metric) its mean over this batch alone."""
    loss = agg_loss(
        per_token,
        mask,
        loss_agg_mode,
        global_tokens=global_tokens,
        global_sequences=global_sequences,
        loss_scale_factor=loss_scale_factor,
    )
    if global_tokens is None and global_sequences is None:
        return loss, float(loss.detach())
    return loss, float(agg_loss(per_token.detach(), mask, loss_agg_mode, loss_scale_factor=loss_scale_factor))


def _weighted(losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    return losses if rollout_is_weights is None else losses * rollout_is_weights.detach().to(losses.dtype)


def vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    global_tokens: Counts = None,
    global_sequences: Counts = None,
    loss_scale_factor: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clip (Schulman et al. 2017, https://arxiv.org/abs/1707.06347) with decoupled clip ranges
    (DAPO's clip-higher, https://arxiv.org/abs/2503.14476) and dual clip (Ye et al. 2020,
    https://arxiv.org/abs/1912.09729).

    ``l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))``; for ``A < 0`` also ``l = min(l, -A c)``
    with ``c = clip_ratio_c > 1``, which bounds the loss of a token whose ratio exploded. The log-ratio
    is clamped to ``[-20, 20]``.
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip lower bound) must be > 1.0, got {clip_ratio_c}")
    low, high = _clip_range(clip_ratio, clip_ratio_low, clip_ratio_high)
    log_ratio, _, adv, mask = _prepare(old_log_prob, log_prob, advantages, response_mask)
    log_ratio = torch.clamp(log_ratio, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    clip_loss = torch.maximum(loss_unclipped, loss_clipped)
    loss_dual = -adv * clip_ratio_c
    per_token = torch.where(adv < 0, torch.minimum(clip_loss, loss_dual), clip_loss)
    loss, local = _aggregate(
        _weighted(per_token, rollout_is_weights),
        mask,
        loss_agg_mode,
        global_tokens,
        global_sequences,
        loss_scale_factor,
    )
    return loss, {
        "actor/pg_loss": local,
        "actor/pg_clipfrac": _frac(loss_clipped > loss_unclipped, mask),
        "actor/ppo_kl": float(masked_mean(-log_ratio.detach(), mask)),
        "actor/pg_clipfrac_lower": _frac((clip_loss > loss_dual) & (adv < 0), mask),
    }


def gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    *,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    global_tokens: Counts = None,
    global_sequences: Counts = None,
    loss_scale_factor: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Group Sequence Policy Optimization (Zheng et al. 2025, https://arxiv.org/abs/2507.18071).

    The sequence ratio ``s_i = exp(mean_t log r_it)`` replaces the token ratio in the clipped objective.
    Per token, ``s_it = sg[s_i] * pi(y_it) / sg[pi(y_it)]``: its value is ``s_i``, its gradient that of
    the token's log-prob, scaled by ``s_i``. The log of ``s_it`` is clamped at 10. The paper (and the
    ``gspo`` preset) uses ``seq-mean-token-mean``; verl forces that mode, rlcore honours
    ``loss_agg_mode``. ``clip_ratio_c`` is unused. The paper's clip ranges are ``3e-4`` / ``4e-4``.
    """
    low, high = _clip_range(clip_ratio, clip_ratio_low, clip_ratio_high)
    log_ratio, lp, adv, mask = _prepare(old_log_prob, log_prob, advantages, response_mask)
    lengths = mask.sum(dim=-1).clamp(min=1).to(log_ratio.dtype)
    seq_log_ratio = log_ratio.sum(dim=-1) / lengths
    log_s = lp - lp.detach() + seq_log_ratio.detach().unsqueeze(-1)
    s = torch.exp(torch.clamp(log_s, max=10.0))
    loss_unclipped = -adv * s
    loss_clipped = -adv * torch.clamp(s, 1.0 - low, 1.0 + high)
    per_token = torch.maximum(loss_unclipped, loss_clipped)
    loss, local = _aggregate(
        _weighted(per_token, rollout_is_weights),
        mask,
        loss_agg_mode,
        global_tokens,
        global_sequences,
        loss_scale_factor,
    )
    return loss, {
        "actor/pg_loss": local,
        "actor/pg_clipfrac": _frac(loss_clipped > loss_unclipped, mask),
        "actor/ppo_kl": float(masked_mean(-log_ratio.detach(), mask)),
        "actor/pg_clipfrac_lower": 0.0,
    }


def gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    global_tokens: Counts = None,
    global_sequences: Counts = None,
    loss_scale_factor: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Group Policy Gradient (Chu et al. 2025, https://arxiv.org/abs/2504.02546): plain policy gradient
    ``l = -A log pi`` with no ratio and no clipping (clip parameters unused)."""
    _, lp, adv, mask = _prepare(old_log_prob, log_prob, advantages, response_mask)
    loss, local = _aggregate(
        _weighted(-adv * lp, rollout_is_weights),
        mask,
        loss_agg_mode,
        global_tokens,
        global_sequences,
        loss_scale_factor,
    )
    return loss, {"actor/pg_loss": local}


def cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    global_tokens: Counts = None,
    global_sequences: Counts = None,
    loss_scale_factor: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO (MiniMax-M1, https://arxiv.org/abs/2506.13585): clip the importance weight, not the update.

    ``l = -sg[clip(r, 1 - eps_low, 1 + eps_high)] * A * log pi``: every token keeps a gradient, scaled by
    its clipped (and stopped) ratio. The log-ratio is clamped to ``[-20, 20]``.
    """
    low, high = _clip_range(clip_ratio, clip_ratio_low, clip_ratio_high)
    log_ratio, lp, adv, mask = _prepare(old_log_prob, log_prob, advantages, response_mask)
    log_ratio = torch.clamp(log_ratio, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1.0 - low, 1.0 + high)
    per_token = -clipped.detach() * adv * lp
    loss, local = _aggregate(
        _weighted(per_token, rollout_is_weights),
        mask,
        loss_agg_mode,
        global_tokens,
        global_sequences,
        loss_scale_factor,
    )
    return loss, {
        "actor/pg_loss": local,
        "actor/pg_clipfrac": _frac(ratio != clipped, mask),
        "actor/ppo_kl": float(masked_mean(-log_ratio.detach(), mask)),
        "actor/pg_clipfrac_lower": 0.0,
    }


def clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    generator: torch.Generator | None = None,
    global_tokens: Counts = None,
    global_sequences: Counts = None,
    loss_scale_factor: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs",
    https://arxiv.org/abs/2505.22617).

    PPO clip loss, except that ``max(1, int(clip_cov_ratio * N))`` tokens drawn at random among those with
    ``clip_cov_lb < cov_t < clip_cov_ub`` (and not already clipped) lose their gradient, where
    ``cov_t = (A_t - mean A) (log pi_t - mean log pi)`` over the batch's ``N`` valid tokens. Cutting the
    tokens with the largest covariance keeps entropy from collapsing. ``generator`` seeds the draw. The
    ratio's log is clamped to ``[-20, 20]`` (verl does not clamp here).
    """
    if clip_cov_ratio <= 0:
        raise ValueError(f"clip_cov_ratio must be > 0, got {clip_cov_ratio}")
    low, high = _clip_range(clip_ratio, clip_ratio_low, clip_ratio_high)
    log_ratio, lp, adv, mask = _prepare(old_log_prob, log_prob, advantages, response_mask)
    ratio = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    clipped_by_ppo = (loss_clipped > loss_unclipped) & mask
    cov = (adv - masked_mean(adv, mask)) * (lp.detach() - masked_mean(lp.detach(), mask))
    candidates = mask & ~clipped_by_ppo & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    n_cut = max(int(clip_cov_ratio * int(mask.sum())), 1)
    where = candidates.nonzero()
    if len(where) > 0:
        pick = torch.randperm(len(where), generator=generator)[:n_cut].to(where.device)
        where = where[pick]
    keep = torch.ones_like(lp)
    keep[where[:, 0], where[:, 1]] = 0.0
    per_token = torch.maximum(loss_unclipped, loss_clipped) * keep
    loss, local = _aggregate(
        _weighted(per_token, rollout_is_weights),
        mask,
        loss_agg_mode,
        global_tokens,
        global_sequences,
        loss_scale_factor,
    )
    return loss, {
        "actor/pg_loss": local,
        "actor/pg_clipfrac": _frac(keep == 0, mask),
        "actor/ppo_kl": float(masked_mean(-log_ratio.detach(), mask)),
    }


def kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    kl_cov_ratio: float = 0.0002,
    ppo_kl_coef: float = 0.1,
    global_tokens: Counts = None,
    global_sequences: Counts = None,
    loss_scale_factor: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov (Cui et al. 2025, https://arxiv.org/abs/2505.22617).

    Unclipped ``l = -A r``; the ``max(1, int(kl_cov_ratio * N))`` valid tokens with the largest covariance
    ``cov_t`` (as in :func:`clip_cov`) get ``l = -A r + ppo_kl_coef * |log r|`` instead. Clip parameters
    unused. Defaults as verl's actor config (``kl_cov_ratio`` 2e-4, ``ppo_kl_coef`` 0.1). The ratio's log
    is clamped to ``[-20, 20]`` (verl does not clamp here).
    """
    if kl_cov_ratio <= 0:
        raise ValueError(f"kl_cov_ratio must be > 0, got {kl_cov_ratio}")
    log_ratio, lp, adv, mask = _prepare(old_log_prob, log_prob, advantages, response_mask)
    ratio = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
    per_token = -adv * ratio
    n_valid = int(mask.sum())
    if n_valid > 0:
        flat = mask.flatten().nonzero().flatten()
        a = adv.detach().flatten()[flat]
        logp = lp.detach().flatten()[flat]
        cov = (a - a.mean()) * (logp - logp.mean())
        top = flat[torch.topk(cov, max(1, int(n_valid * kl_cov_ratio))).indices]
        penalised = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
        penalised[top] = True
        penalised = penalised.view_as(mask)
        per_token = torch.where(penalised, per_token + ppo_kl_coef * log_ratio.abs(), per_token)
    loss, local = _aggregate(
        _weighted(per_token, rollout_is_weights),
        mask,
        loss_agg_mode,
        global_tokens,
        global_sequences,
        loss_scale_factor,
    )
    return loss, {"actor/pg_loss": local, "actor/ppo_kl": float(masked_mean(log_ratio.detach().abs(), mask))}


def geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    *,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    global_tokens: Counts = None,
    global_sequences: Counts = None,
    loss_scale_factor: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Geometric-Mean Policy Optimization (Zhao et al. 2025, https://arxiv.org/abs/2507.20673).

    Per sequence, the geometric mean of token ratios, each clipped in log space towards the side the
    advantage sign pushes: ``l_i = -Abar_i * exp(mean_t sgn(A) min(sgn(A) log r_t, sgn(A) clip(log r_t,
    -eps_low, eps_high)))`` with ``Abar_i`` the sequence's mean advantage; the loss is the mean of
    ``l_i`` over non-empty sequences (divided by ``global_sequences`` when given; verl divides by all
    rows). The loss is always this sequence mean: ``loss_agg_mode`` is accepted for a uniform call and
    ignored, as in verl.
    """
    low, high = _clip_range(clip_ratio, clip_ratio_low, clip_ratio_high)
    log_ratio, _, adv, mask = _prepare(old_log_prob, log_prob, advantages, response_mask)
    sign = torch.sign(adv)
    clamped = torch.clamp(log_ratio, min=-low, max=high)
    bounded = sign * torch.minimum(sign * log_ratio, sign * clamped)
    lengths = mask.sum(dim=-1)
    denom = lengths.clamp(min=1).to(log_ratio.dtype)
    seq_ratio = torch.exp((bounded * mask).sum(dim=-1) / denom)
    seq_adv = (adv * mask).sum(dim=-1) / denom
    per_seq = -seq_adv * seq_ratio
    if rollout_is_weights is not None:
        # Token weights become a sequence weight by their geometric mean, matching the ratio.
        log_w = torch.log(rollout_is_weights.detach().to(per_seq.dtype) + 1e-10)
        per_seq = per_seq * torch.exp(torch.where(mask, log_w, 0.0).sum(dim=-1) / denom)
    total = torch.where(lengths > 0, per_seq, 0.0).sum()
    local_seqs = (lengths > 0).sum()
    n_seq = local_seqs if global_sequences is None else global_sequences
    loss = total / torch.as_tensor(n_seq, dtype=per_seq.dtype).clamp(min=1)
    was_clipped = log_ratio != clamped
    return loss, {
        "actor/pg_loss": float(total.detach() / local_seqs.clamp(min=1)),
        "actor/pg_clipfrac": _frac(was_clipped & (adv > 0), mask),
        "actor/ppo_kl": float(masked_mean(-log_ratio.detach(), mask)),
        "actor/pg_clipfrac_lower": _frac(was_clipped & (adv < 0), mask),
    }


def _frac(flags: torch.Tensor, mask: torch.Tensor) -> float:
    return float(masked_mean(flags.to(torch.float32), mask))

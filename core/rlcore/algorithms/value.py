"""The critic's clipped value loss (PPO, Schulman et al. 2017, https://arxiv.org/abs/1707.06347)."""

from __future__ import annotations

import torch

from rlcore.algorithms.aggregation import agg_loss, masked_mean


def value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float | None = 0.5,
    loss_agg_mode: str = "token-mean",
    *,
    global_tokens: int | float | torch.Tensor | None = None,
    global_sequences: int | float | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``0.5 * agg(max((v - G)^2, (clip(v, v_old - c, v_old + c) - G)^2))``.

    ``vpreds [B, T]``: the critic's current values (with gradient); ``returns [B, T]``: targets ``G``;
    ``values [B, T]``: the values when the batch was generated (``v_old``); ``cliprange_value`` ``c``
    (``None``: no clipping). Computed in at least float32. Metrics, over this batch alone:
    ``critic/vf_loss`` (the loss as if this batch were the whole batch), ``critic/vf_clipfrac`` (fraction of
    valid tokens where the clipped term was larger) and ``critic/vpred_mean``.
    """
    for name, t in (("returns", returns), ("values", values), ("response_mask", response_mask)):
        if t.shape != vpreds.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, but vpreds has {tuple(vpreds.shape)}")
    mask = response_mask.bool()
    dtype = torch.promote_types(vpreds.dtype, torch.float32)
    zero = torch.zeros((), dtype=dtype, device=vpreds.device)
    v = torch.where(mask, vpreds.to(dtype), zero)
    g = torch.where(mask, returns.to(dtype).detach(), zero)
    v_old = torch.where(mask, values.to(dtype).detach(), zero)
    loss_plain = (v - g) ** 2
    if cliprange_value is None:
        loss_clip = loss_plain
    else:
        if cliprange_value < 0:
            raise ValueError(f"cliprange_value must be >= 0 or None, got {cliprange_value}")
        loss_clip = (torch.clamp(v, v_old - cliprange_value, v_old + cliprange_value) - g) ** 2
    per_token = torch.maximum(loss_plain, loss_clip)
    loss = 0.5 * agg_loss(
        per_token,
        mask,
        loss_agg_mode,
        global_tokens=global_tokens,
        global_sequences=global_sequences,
        loss_scale_factor=loss_scale_factor,
    )
    if global_tokens is None and global_sequences is None:
        local = float(loss.detach())
    else:
        local = 0.5 * float(
            agg_loss(per_token.detach(), mask, loss_agg_mode, loss_scale_factor=loss_scale_factor)
        )
    return loss, {
        "critic/vf_loss": local,
        "critic/vf_clipfrac": float(masked_mean((loss_clip > loss_plain).float(), mask)),
        "critic/vpred_mean": float(masked_mean(v.detach(), mask)),
    }

"""Token entropy of the policy, and its aggregated bonus."""

from __future__ import annotations

import torch

from rlcore.algorithms.aggregation import agg_loss


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy ``H = logsumexp(z) - sum softmax(z) z`` over the last axis: ``[B, T, V]`` -> ``[B, T]``.

    Computed in at least float32, stably for large logits.
    """
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


def entropy_loss(
    entropy: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    global_tokens: int | float | torch.Tensor | None = None,
    global_sequences: int | float | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Mean entropy ``entropy [B, T]`` aggregated like the policy loss; an actor subtracts
    ``entropy_coeff`` times it from its loss to reward exploration."""
    return agg_loss(
        entropy,
        response_mask,
        loss_agg_mode,
        global_tokens=global_tokens,
        global_sequences=global_sequences,
        loss_scale_factor=loss_scale_factor,
    )

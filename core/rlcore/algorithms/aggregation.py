"""Reducing a per-token loss matrix ``[B, T]`` to the scalar an optimizer steps on.

Normalisation across micro-batches and data-parallel ranks: an engine *sums* gradients over micro-batches
and ranks (see :mod:`rlcore.api.train_engine`). So each micro-batch divides by counts taken over the
whole mini-batch on all ranks (``global_tokens``, ``global_sequences``); the sum of the micro-batch losses
is then exactly the mini-batch loss, whatever the split. Without these counts the local micro-batch is the
whole batch (plain ``token-mean`` over its valid tokens).

Modes (verl's names):

``token-mean``
    ``sum(l * m) / N_tok``: every valid token weighs the same (DAPO's token-level loss).
``seq-mean-token-sum``
    ``sum_i sum_t l_it m_it / N_seq``.
``seq-mean-token-mean``
    ``sum_i (sum_t l_it m_it / sum_t m_it) / N_seq`` (the original GRPO loss).
``seq-mean-token-sum-norm``
    ``sum_i sum_t l_it m_it / (C * N_seq)`` with a constant ``C`` (``loss_scale_factor``, default ``T``),
    Dr. GRPO's length-unbiased loss.

``N_seq`` counts only sequences with at least one valid token, so a fully masked row never dilutes a mean.
"""

from __future__ import annotations

import torch

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def check_loss_agg_mode(loss_agg_mode: str) -> None:
    """Raise a ``ValueError`` listing the known modes if ``loss_agg_mode`` is not one of them."""
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; use one of {', '.join(LOSS_AGG_MODES)}")


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is non-zero; NaN or inf outside the mask never leaks in."""
    picked = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
    return picked.sum() if dim is None else picked.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over the masked entries; 0 where the mask selects nothing."""
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1).to(values.dtype)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(values - mean) / sqrt(var + 1e-8)`` with mean and unbiased variance over the masked entries.

    ``values``, ``mask``: ``[B, T]``. Entries outside the mask come back as 0. With fewer than two valid
    entries the variance is undefined; the result is then all zeros (verl raises instead).
    """
    m = mask.bool()
    n = int(m.sum())
    if n < 2:
        return torch.zeros_like(values)
    mean = masked_sum(values, m) / n
    var = masked_sum((values - mean) ** 2, m) / (n - 1)
    return torch.where(m, (values - mean) * torch.rsqrt(var + 1e-8), torch.zeros_like(values))


def global_batch_counts(response_mask: torch.Tensor) -> dict[str, int]:
    """``{"global_tokens", "global_sequences"}`` for a whole mini-batch ``response_mask [B, T]``.

    The controller computes these once per mini-batch (before splitting it over ranks) and puts them in
    ``batch.meta``; on a shard, the same counts summed over all ranks give the same numbers.
    """
    m = response_mask.bool()
    return {"global_tokens": int(m.sum()), "global_sequences": int(m.any(dim=-1).sum())}


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    global_tokens: int | float | torch.Tensor | None = None,
    global_sequences: int | float | torch.Tensor | None = None,
    loss_scale_factor: int | float | None = None,
) -> torch.Tensor:
    """Aggregate ``loss_mat [B, T]`` over ``loss_mask [B, T]`` into a scalar (see the module docstring).

    ``global_tokens`` / ``global_sequences``: valid tokens / non-empty sequences in the whole mini-batch
    over all data-parallel ranks; ``None`` means this batch is the whole batch. ``loss_scale_factor``:
    the constant ``C`` of ``seq-mean-token-sum-norm`` (default ``T``; set it to the maximum response
    length so micro-batches padded to different widths share one scale).
    """
    check_loss_agg_mode(loss_agg_mode)
    if loss_mat.shape != loss_mask.shape:
        raise ValueError(
            f"loss_mat {tuple(loss_mat.shape)} and loss_mask {tuple(loss_mask.shape)} differ in shape"
        )
    # Sums over thousands of tokens lose digits in bf16; accumulate in at least float32.
    loss_mat = loss_mat.to(torch.promote_types(loss_mat.dtype, torch.float32))
    mask = loss_mask.bool()
    if loss_agg_mode == "token-mean":
        denom = mask.sum() if global_tokens is None else global_tokens
        return masked_sum(loss_mat, mask) / _positive(denom, loss_mat)
    seq_tokens = mask.sum(dim=-1)
    seq_sums = masked_sum(loss_mat, mask, dim=-1)
    seq_denom = (seq_tokens > 0).sum() if global_sequences is None else global_sequences
    if loss_agg_mode == "seq-mean-token-sum":
        return seq_sums.sum() / _positive(seq_denom, loss_mat)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_means = seq_sums / seq_tokens.clamp(min=1).to(loss_mat.dtype)
        return seq_means.sum() / _positive(seq_denom, loss_mat)
    scale = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
    if scale <= 0:
        raise ValueError(f"loss_scale_factor must be positive, got {scale}")
    return seq_sums.sum() / (_positive(seq_denom, loss_mat) * scale)


def _positive(count: int | float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A count as a tensor of ``like``'s dtype, at least 1 so an empty batch gives 0, never NaN."""
    count = torch.as_tensor(count, device=like.device)
    if bool(count < 0):
        raise ValueError(f"global token/sequence counts must be >= 0, got {count.item()}")
    return count.to(like.dtype).clamp(min=1)

"""Log-probabilities and entropy from logits split over tensor-parallel ranks along the vocabulary.

Each rank holds ``logits [..., V/tp]`` for vocabulary rows ``[start, start + V/tp)``. The softmax
needs three sums over the whole vocabulary (of ``exp``, of ``exp * logit`` and the target's logit),
each an all-reduce whose backward is the identity: every rank computes the same loss from the reduced
values, so the gradient reaching a rank's local logits is exactly that rank's share. Padded vocabulary
rows (beyond the real ``vocab_size``) are cut off before the softmax, so they carry no probability.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class _SumOverGroup(torch.autograd.Function):
    """All-reduce sum forward, identity backward (the loss downstream is replicated on every rank)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


class _SumGradOverGroup(torch.autograd.Function):
    """Identity forward, all-reduce sum of the gradient backward (an input every rank uses for its
    vocabulary slice: each rank's gradient is a part of the whole)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()  # a copy where it was not: the all-reduce writes in place
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def sum_grad_over_group(x: torch.Tensor, group) -> torch.Tensor:
    """``x`` unchanged; its gradient summed over ``group`` in the backward."""
    return _SumGradOverGroup.apply(x, group)


def _sum(x: torch.Tensor, group) -> torch.Tensor:
    return x if group is None else _SumOverGroup.apply(x, group)


def log_probs_and_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    vocab_start: int,
    vocab_size: int,
    group=None,
    temperature: float = 1.0,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log p(targets)`` and the entropy of ``softmax(logits / temperature)``, both ``[...]`` in fp32.

    ``logits [..., v]``: this rank's vocabulary slice starting at global row ``vocab_start``;
    ``targets [...]``: global token ids; ``vocab_size``: real (unpadded) vocabulary size; ``group``:
    the tensor-parallel process group (None: the slice is the whole vocabulary).
    """
    real = max(0, min(logits.shape[-1], vocab_size - vocab_start))
    logits = logits[..., :real].float()
    if temperature != 1.0:
        logits = logits / temperature
    with torch.no_grad():
        if real:
            shift = logits.max(-1).values
        else:
            shift = torch.full(logits.shape[:-1], torch.finfo(torch.float32).min, device=logits.device)
        if group is not None:
            dist.all_reduce(shift, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - shift.unsqueeze(-1)
    exp = shifted.exp()
    sum_exp = _sum(exp.sum(-1), group)
    log_z = sum_exp.log()

    local = targets - vocab_start
    here = (local >= 0) & (local < real)
    picked = (
        shifted.gather(-1, local.clamp(0, max(real - 1, 0)).unsqueeze(-1)).squeeze(-1) if real else shift * 0
    )
    target_logit = _sum(torch.where(here, picked, torch.zeros_like(picked)), group)
    log_probs = target_logit - log_z

    entropy = None
    if with_entropy:
        expected_logit = _sum((exp * shifted).sum(-1), group) / sum_exp
        entropy = log_z - expected_logit
    return log_probs, entropy


def chunked_log_probs_and_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_tokens: int,
    vocab_start: int,
    vocab_size: int,
    group=None,
    temperature: float = 1.0,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`log_probs_and_entropy` of ``F.linear(hidden, weight)``, ``chunk_tokens`` positions at a
    time: ``hidden [..., h]``, ``weight [v, h]`` (this rank's vocabulary rows), ``targets [...]`` ->
    ``[...]`` each. Under autograd each chunk is checkpointed: its logits ``[chunk, v]`` are dropped
    after the forward and recomputed in the backward (with its all-reduces, in the same order on every
    tensor-parallel rank), so the full logits never exist at once."""
    from torch.utils.checkpoint import checkpoint

    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_targets = targets.reshape(-1)

    def head(h: torch.Tensor, t: torch.Tensor, w: torch.Tensor):
        return log_probs_and_entropy(
            torch.nn.functional.linear(h, w),
            t,
            vocab_start=vocab_start,
            vocab_size=vocab_size,
            group=group,
            temperature=temperature,
            with_entropy=with_entropy,
        )

    log_probs, entropies = [], []
    for start in range(0, flat_hidden.shape[0], chunk_tokens):
        h, t = flat_hidden[start : start + chunk_tokens], flat_targets[start : start + chunk_tokens]
        if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
            lp, ent = checkpoint(head, h, t, weight, use_reentrant=False)
        else:
            lp, ent = head(h, t, weight)
        log_probs.append(lp)
        entropies.append(ent)
    log_prob = torch.cat(log_probs).view(targets.shape)
    entropy = torch.cat(entropies).view(targets.shape) if with_entropy else None
    return log_prob, entropy

"""Log-probabilities and entropy from logits split over tensor-parallel ranks along the vocabulary.

Each rank holds ``logits [..., V/tp]`` for vocabulary rows ``[start, start + V/tp)``. The softmax
needs three sums over the whole vocabulary (of ``exp``, of ``exp * logit`` and the target's logit),
each an all-reduce whose backward is the identity: every rank computes the same loss from the reduced
values, so the gradient reaching a rank's local logits is exactly that rank's share. Padded vocabulary
rows (beyond the real ``vocab_size``) are cut off before the softmax, so they carry no probability.

:func:`chunked_log_probs_and_entropy` is the head the engine uses with ``megatron.logits_chunk_size``:
straight from the hidden state, chunk by chunk, with each rank's statistics fused and combined once.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from rlcore.kernels.logits import chunked_head_grads, keeps_logits, slice_kernels


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


def slice_statistics(logits: torch.Tensor, local: torch.Tensor, temperature: float, stats) -> torch.Tensor:
    """One rank's statistics ``[3, c]`` of its slice ``logits [c, v]`` (``v >= 1`` real rows): ``lse_r``, the
    slice's expected logit ``E_r[z]`` under its own softmax, and the target's logit where ``local [c]``
    (the target's row in the slice) lies in ``[0, v)``, else 0; ``z = logits / temperature``. ``stats``:
    ``rlcore.kernels.logits.slice_kernels``' first function."""
    here = (local >= 0) & (local < logits.shape[-1])
    log_probs, entropy, lse = stats(logits, local.clamp(0, logits.shape[-1] - 1), temperature)
    return torch.stack([lse, lse - entropy, torch.where(here, log_probs + lse, 0.0)])


def combine_slices(stats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every rank's :func:`slice_statistics`, ``[tp, 3, c]`` -> the whole vocabulary's ``(log_probs,
    entropy, lse)`` ``[c]`` each: ``lse = logsumexp_r lse_r``; the softmax mass on slice ``r`` is
    ``w_r = exp(lse_r - lse)``, so ``E[z] = sum_r w_r E_r[z]`` and ``H = lse - E[z]``."""
    lse_r, ez_r, zt_r = stats.unbind(1)  # [tp, c] each
    lse = torch.logsumexp(lse_r, 0)
    expected = (torch.exp(lse_r - lse) * ez_r).sum(0)
    return zt_r.sum(0) - lse, lse - expected, lse


def _gather(local: torch.Tensor, group) -> torch.Tensor:
    """``local [3, c]`` from every rank of ``group`` -> ``[tp, 3, c]`` (one all-gather)."""
    if group is None:
        return local.unsqueeze(0)
    tp = dist.get_world_size(group)
    gathered = local.new_empty(tp * local.shape[0], local.shape[1])  # ranks along dim 0 (gloo's form)
    dist.all_gather_into_tensor(gathered, local.contiguous(), group=group)
    return gathered.view(tp, *local.shape)


class _VocabSliceLogProbs(torch.autograd.Function):
    """:func:`rlcore.kernels.logits.linear_log_probs` for a rank that holds vocabulary rows ``[start, start + v)``:
    per chunk the slice's logits, their fused statistics (``rlcore.kernels.logits.slice_kernels``), one
    all-gather to combine them; the backward recomputes each chunk's logits (or, ``keep``, takes the
    forward's) and builds their gradient from the saved whole-vocabulary ``lse`` and entropy, with no
    communication (the hidden state's gradient is this rank's part; ``model.pass_hidden_through`` sums it
    over the ranks)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, start, group, temperature, chunk, compiled, keep):
        stats, _ = slice_kernels(compiled)
        # Kept chunks live on ctx, not save_for_backward, so the backward frees each once used.
        ctx.logits = [] if keep and weight.shape[0] else None
        local = targets - start
        here = (local >= 0) & (local < weight.shape[0])
        out_dtype = torch.promote_types(hidden.dtype, torch.float32)
        log_probs = hidden.new_empty(hidden.shape[0], dtype=out_dtype)
        entropy, lse = torch.empty_like(log_probs), torch.empty_like(log_probs)
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s : s + chunk]
            if weight.shape[0]:
                logits = F.linear(h, weight)
                mine = slice_statistics(logits, local[s : s + chunk], temperature, stats)
                if ctx.logits is not None:
                    ctx.logits.append(logits)
                del logits
            else:  # a rank holding only padding rows: no probability mass
                mine = torch.zeros(3, h.shape[0], dtype=out_dtype, device=h.device)
                mine[0] = float("-inf")
            log_probs[s : s + chunk], entropy[s : s + chunk], lse[s : s + chunk] = combine_slices(
                _gather(mine, group)
            )
        ctx.save_for_backward(hidden, weight, torch.where(here, local, -1), lse, entropy)
        ctx.temperature, ctx.chunk, ctx.compiled = temperature, chunk, compiled
        return log_probs, entropy

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        hidden, weight, local, lse, entropy = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[:2]
        if not weight.shape[0]:  # only padding rows here: this rank's part of every gradient is zero
            return (
                (torch.zeros_like(hidden) if need_h else None),
                (torch.zeros_like(weight) if need_w else None),
                *[None] * 7,
            )
        _, grad_logits = slice_kernels(ctx.compiled)
        kept, ctx.logits = ctx.logits, None
        grad_hidden, grad_weight, _ = chunked_head_grads(
            hidden,
            weight,
            None,
            local,
            lse,
            entropy,
            g_lp,
            g_ent,
            ctx.temperature,
            ctx.chunk,
            grad_logits,
            (need_h, need_w, False),
            kept,
        )
        return grad_hidden, grad_weight, None, None, None, None, None, None, None


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
    compiled: bool = False,
    keep_logits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`log_probs_and_entropy` of ``F.linear(hidden, weight)``, ``chunk_tokens`` positions at a
    time: ``hidden [..., h]``, ``weight [v, h]`` (this rank's vocabulary rows, from global row
    ``vocab_start``; rows past ``vocab_size`` are padding and get no probability), ``targets [...]`` ->
    ``[...]`` each, fp32. One autograd function over all chunks, as the TP=1 head
    (:func:`rlcore.kernels.logits.linear_log_probs`): a chunk's ``[chunk, v]`` logits exist only while it is
    worked on, in the forward and again in the backward; ``compiled`` fuses the vocabulary-wide
    elementwise work with ``torch.compile``; ``keep_logits`` keeps each chunk's ``[chunk, v]`` logits
    from the forward for the backward instead of recomputing them (only when a gradient will be taken),
    as the TP=1 head's ``keep_logits``: one output-layer matmul less per token, for the memory of the
    rank's slice of the logits. Per chunk the ranks exchange ``3 x chunk`` floats once, in
    the forward only (eager unfused, this head took about a third of a TP=2 step of the 0.5B shape on an
    H200: a dozen fp32 passes over the logits and four all-reduces per chunk, each again in the backward).
    """
    real = max(0, min(weight.shape[0], vocab_size - vocab_start))
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    if flat_hidden.shape[0] == 0:
        empty = flat_hidden.new_zeros(targets.shape, dtype=torch.promote_types(hidden.dtype, torch.float32))
        return empty, (empty if with_entropy else None)
    log_prob, entropy = _VocabSliceLogProbs.apply(
        flat_hidden,
        weight[:real],
        targets.reshape(-1),
        int(vocab_start),
        group,
        float(temperature),
        int(chunk_tokens),
        bool(compiled),
        keeps_logits(keep_logits, flat_hidden, weight),
    )
    return log_prob.view(targets.shape), (entropy.view(targets.shape) if with_entropy else None)

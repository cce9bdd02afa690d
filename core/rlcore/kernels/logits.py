"""Log-probs and entropy straight from hidden states and the output layer, chunk by chunk.

The language-model head of the FSDP engine, and of the Megatron engine where one rank holds the whole
vocabulary (tensor-parallel size 1).

``linear_log_probs(hidden [M, H], weight [V, H], bias [V] | None, targets [M], temperature, chunk)``
returns ``log_probs [M]`` (of ``targets`` under ``softmax(logits / temperature)``) and ``entropy [M]`` of
that distribution, at least fp32. It is one autograd function over all chunks:

- forward: per chunk of ``chunk`` tokens, the ``[chunk, V]`` logits, their fp32 statistics (log-partition
  ``lse``, the target's log-prob, the entropy), then the logits are dropped; only ``hidden`` and the
  ``[M]`` statistics are kept;
- backward: per chunk, the logits once more (the only recomputation; with ``keep_logits`` the forward
  keeps them instead, in the compute dtype) and, in place,
  ``dL/dz = g_lp * onehot(target) - p * (g_lp + g_ent * (z - lse + entropy))`` with ``z = logits / T``
  and ``p = softmax(z)``, then the two matmuls for the hidden and weight gradients (the weight's summed
  over chunks in fp32).

Full-vocabulary logits therefore never exist for more than one chunk, in the forward or the backward, and
the vocabulary-wide elementwise work is a few passes per chunk instead of the dozen an autograd graph of
``logsumexp``/``softmax``/``gather`` under activation checkpointing makes.

With ``compiled=True`` the two vocabulary-wide elementwise steps (:func:`_stats`, and
:func:`_grad_logits` in a compiler-friendly form) go through ``torch.compile``, which fuses each into
one or two passes over the bf16 logits; in eager mode each is about ten fp32 passes, which on a 150k
vocabulary costs more device time than the output layer's matmuls (measured on an H100,
``docs/benchmarks.md``).

``keep_logits`` trades memory for compute: the ``[M, V]`` logits (``M * V * 2`` bytes in bf16; 5 GB for
16k tokens of a 150k vocabulary) live from forward to backward, and the backward skips one output-layer
matmul per token, about 5% of a 1.5B model's training FLOPs. The kept values are the ones the backward
would recompute (same matmul, same chunks), so the gradients are the same.

Derivation of the entropy term: ``H = lse - sum_j p_j z_j``; with ``d lse/dz_j = p_j`` and
``dp_i/dz_j = p_i (delta_ij - p_j)``, ``dH/dz_j = -p_j (z_j - sum_i p_i z_i) = -p_j (z_j - lse + H)``.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits [c, V] / temperature`` in at least fp32 (``logits`` itself when nothing changes)."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return z / temperature if temperature != 1.0 else z


def _stats(logits: torch.Tensor, targets: torch.Tensor, temperature: float):
    """``logits [c, V]`` -> fp32 ``log_probs``, ``entropy``, ``lse`` ``[c]``."""
    z = _scaled(logits, temperature)
    lse = torch.logsumexp(z, dim=-1)
    log_probs = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    p = torch.exp(z - lse.unsqueeze(-1))
    entropy = lse - torch.linalg.vecdot(p, z)
    return log_probs, entropy, lse


def _grad_logits(
    logits: torch.Tensor,
    targets: torch.Tensor,
    lse: torch.Tensor,
    entropy: torch.Tensor,
    g_lp: torch.Tensor,
    g_ent: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """``dL/dlogits [c, V]`` in ``logits.dtype`` from the upstream ``g_lp``/``g_ent [c]`` (see module doc)."""
    z = _scaled(logits, temperature)
    if z is logits:  # z is about to be overwritten in place
        z = z.clone()
    p = torch.exp(z - lse.unsqueeze(-1))
    # z becomes the gradient in place: -(p * (g_lp + g_ent * (z - lse + H))) + g_lp * onehot
    z.sub_((lse - entropy).unsqueeze(-1)).mul_(g_ent.unsqueeze(-1)).add_(g_lp.unsqueeze(-1)).mul_(p).neg_()
    z.scatter_add_(-1, targets.unsqueeze(-1), g_lp.unsqueeze(-1))
    if temperature != 1.0:
        z.div_(temperature)
    return z.to(logits.dtype)


def _grad_logits_functional(
    logits: torch.Tensor,
    targets: torch.Tensor,
    lse: torch.Tensor,
    entropy: torch.Tensor,
    g_lp: torch.Tensor,
    g_ent: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """The same as :func:`_grad_logits`, written for ``torch.compile``: no in-place updates and the
    target's term as a ``where`` instead of a scatter, so the compiler makes one pass that reads the
    logits and writes the gradient. Compiled, the in-place form took 2.3x as long on an H100
    (``benchmarks/logits_kernels.py``); eager, this form would hold twice its fp32 ``[c, V]`` temporaries."""
    z = _scaled(logits, temperature)
    lse, entropy, g_lp, g_ent = (t.unsqueeze(-1) for t in (lse, entropy, g_lp, g_ent))
    p = torch.exp(z - lse)
    target = torch.arange(z.shape[-1], device=z.device) == targets.unsqueeze(-1)
    grad = torch.where(target, g_lp, 0.0) - p * (g_lp + g_ent * (z - lse + entropy))
    if temperature != 1.0:
        grad = grad / temperature
    return grad.to(logits.dtype)


@functools.cache
def _compiled_kernels():
    """:func:`_stats` and :func:`_grad_logits_functional` through ``torch.compile``, built once.

    Shapes are automatic-dynamic (torch's default), not ``dynamic=True``: the chunk length becomes
    symbolic once a second length is seen, while the vocabulary size stays a constant: with a symbolic
    vocabulary size these memory-bound kernels took 1.3x (statistics) and 1.25x (gradient) as long on an
    H100 (``benchmarks/logits_kernels.py``; each element's row index is then a division by a runtime value).
    """
    return torch.compile(_stats), torch.compile(_grad_logits_functional)


def _kernels(compiled: bool):
    """``(statistics, gradient)`` functions: compiled, or eager (:func:`_stats`, :func:`_grad_logits`)."""
    return _compiled_kernels() if compiled else (_stats, _grad_logits)


def slice_kernels(compiled: bool):
    """``(statistics, gradient)`` for a head that holds a slice of the vocabulary (the Megatron engine's
    vocabulary-parallel head): ``stats(logits [c, v], targets [c], T) -> (log_probs, entropy, lse)``
    of the slice alone, and ``grad(logits, targets, lse, entropy, g_lp, g_ent, T) -> [c, v]`` given the
    whole vocabulary's ``lse`` and ``entropy``. The gradient is the functional form, whose one-hot term is
    zero for a target outside ``[0, v)`` (pass -1 where another rank holds it); compiled as above."""
    return _compiled_kernels() if compiled else (_stats, _grad_logits_functional)


class _LinearLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk, compiled, keep_logits):
        stats, _ = _kernels(compiled)
        # Kept chunks are intermediates, held on ctx (not save_for_backward) so the backward can free
        # each one as soon as it has used it.
        ctx.logits = [] if keep_logits else None
        out_dtype = torch.promote_types(hidden.dtype, torch.float32)
        log_probs = hidden.new_empty(hidden.shape[0], dtype=out_dtype)
        entropy, lse = torch.empty_like(log_probs), torch.empty_like(log_probs)
        for s in range(0, hidden.shape[0], chunk):
            logits = F.linear(hidden[s : s + chunk], weight, bias)
            log_probs[s : s + chunk], entropy[s : s + chunk], lse[s : s + chunk] = stats(
                logits, targets[s : s + chunk], temperature
            )
            if keep_logits:
                ctx.logits.append(logits)
            del logits
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
        ctx.temperature, ctx.chunk, ctx.compiled = temperature, chunk, compiled
        return log_probs, entropy

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        _, grad_logits = _kernels(ctx.compiled)
        kept, ctx.logits = ctx.logits, None
        grads = chunked_head_grads(
            hidden,
            weight,
            bias,
            targets,
            lse,
            entropy,
            g_lp,
            g_ent,
            ctx.temperature,
            ctx.chunk,
            grad_logits,
            ctx.needs_input_grad[:3],
            kept,
        )
        return (*grads, None, None, None, None, None)


def chunked_head_grads(
    hidden,
    weight,
    bias,
    targets,
    lse,
    entropy,
    g_lp,
    g_ent,
    temperature,
    chunk,
    grad_logits,
    needs,
    kept=None,
):
    """The backward of a chunked head, shared by :class:`_LinearLogProbs` and the Megatron engine's
    vocabulary-slice head: per chunk the logits ``F.linear(hidden, weight, bias)`` (or the next of
    ``kept``, each freed once used), ``grad_logits(...) [c, V]``, then the matmuls for whichever of
    ``(hidden, weight, bias)`` ``needs`` marks: ``(grad_hidden [M, H], grad_weight [V, H], grad_bias [V])``,
    None where not needed; weight and bias gradients summed over chunks in at least fp32. ``g_lp``/``g_ent``
    ``[M]`` may be None (that output unused)."""
    g_lp = torch.zeros_like(lse) if g_lp is None else g_lp
    g_ent = torch.zeros_like(lse) if g_ent is None else g_ent
    need_h, need_w, need_b = needs
    grad_hidden = torch.empty_like(hidden) if need_h else None
    acc = torch.promote_types(weight.dtype, torch.float32)
    grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
    grad_bias = torch.zeros(bias.shape, dtype=acc, device=bias.device) if need_b else None
    for k, s in enumerate(range(0, hidden.shape[0], chunk)):
        h = hidden[s : s + chunk]
        if kept is None:
            logits = F.linear(h, weight, bias)
        else:
            logits, kept[k] = kept[k], None
        grad = grad_logits(
            logits,
            targets[s : s + chunk],
            lse[s : s + chunk],
            entropy[s : s + chunk],
            g_lp[s : s + chunk],
            g_ent[s : s + chunk],
            temperature,
        )  # [c, V]
        del logits
        if need_h:
            grad_hidden[s : s + chunk] = grad @ weight
        if need_w:
            grad_weight += (grad.t() @ h).to(acc)
        if need_b:
            grad_bias += grad.sum(0, dtype=acc)
    return (
        grad_hidden,
        None if grad_weight is None else grad_weight.to(weight.dtype),
        None if grad_bias is None else grad_bias.to(bias.dtype),
    )


def keeps_logits(keep_logits: bool, *inputs: torch.Tensor | None) -> bool:
    """Whether a head asked to ``keep_logits`` keeps them: only when a gradient will be taken (grad mode
    on and one of the head's ``inputs`` requires it); otherwise no backward would free them."""
    return keep_logits and torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs)


def linear_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
    chunk_size: int,
    compiled: bool = False,
    keep_logits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropy ``[M]`` (at least fp32) of ``targets [M]`` under the output layer
    ``weight [V, H]`` (+ ``bias [V]``) applied to ``hidden [M, H]``, ``chunk_size`` tokens at a time;
    ``compiled`` fuses the elementwise work with ``torch.compile``; ``keep_logits`` keeps the logits
    for the backward instead of recomputing them (only when a gradient will be taken)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if hidden.shape[0] == 0:
        empty = hidden.new_zeros(0, dtype=torch.promote_types(hidden.dtype, torch.float32))
        return empty, empty
    keep = keeps_logits(keep_logits, hidden, weight, bias)
    return _LinearLogProbs.apply(
        hidden, weight, bias, targets, float(temperature), int(chunk_size), bool(compiled), keep
    )

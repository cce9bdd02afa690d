"""Mixture-of-experts experts computed with one grouped GEMM per projection (``megatron.moe_grouped_gemm``).

megatron-core's local experts (``SequentialMLP``) run one matmul per expert over its tokens, which on an
H200 computes one Qwen3-30B-A3B expert layer at about 15 TFLOP/s; PyTorch's grouped GEMM
(``torch.nn.functional.grouped_mm``: every expert's matmul in one kernel, groups given by offsets) runs the
same layer at about 470 (``benchmarks/moe_experts_gpu.py``, docs/benchmarks.md). megatron-core's own grouped
experts need Transformer Engine or the ``grouped_gemm`` package.

:class:`GroupedExperts` keeps ``SequentialMLP``'s parameters exactly (one ``linear_fc1`` ``[2F/tp, h]`` and
``linear_fc2`` ``[h, F/tp]`` per local expert), so parameter names, the HF conversion, expert parallelism,
the distributed optimizer and checkpoints are unchanged, and stacks them into ``[E, out, in]`` copies.
Inside :func:`stacked_once` (the engine's forward/backward over a step's micro-batches, during which the
weights do not change) a layer stacks once and every micro-batch, and the activation checkpoint's recompute,
reuses the copy (stacking per forward was 58 ms of a 65,536-token 4-GPU Qwen3-30B-A3B step, about 1% of
the 262,144-token one: docs/benchmarks.md). The stack's gradient goes straight into the experts'
``main_grad`` (megatron's fp32 accumulation buffer), as megatron-core's fused weight-gradient accumulation
does, with one add through a strided view of the buffer instead of an add per expert from DDP's hooks (84
ms of the smaller step). The experts' own linear layers communicate nothing here
(megatron-core leaves an expert layer's tensor/expert-parallel exchange to its token dispatcher), so two
local grouped matmuls compute what the linears would.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from megatron.core.transformer.moe.experts import SequentialMLP


def use_grouped_experts(model: torch.nn.Module) -> None:
    """Make every local-experts module of the built ``model`` a :class:`GroupedExperts`.

    The class is swapped on the built modules rather than named in the layer spec: megatron-core's MoE
    spec is a ``ModuleSpec`` in 0.16 and a ``functools.partial`` in 0.19 (the GPU machine's), and
    :class:`GroupedExperts` adds no state of its own, only its forward."""
    if not hasattr(F, "grouped_mm"):
        raise ValueError(
            f"megatron.moe_grouped_gemm needs torch.nn.functional.grouped_mm (PyTorch 2.9 or later; this is "
            f"{torch.__version__}): upgrade PyTorch or set megatron.moe_grouped_gemm=false"
        )
    for module in model.modules():
        if type(module) is SequentialMLP:
            module.__class__ = GroupedExperts


class GroupedExperts(SequentialMLP):
    """``SequentialMLP`` computed by grouped GEMMs: ``(hidden [T, h] sorted by expert, tokens_per_expert
    [E_local], probs [T]) -> (out [T, h], None)``, ``out = (silu(gate) * up * probs) @ W2`` per expert."""

    def _grouped(self) -> bool:
        c = self.config
        return (
            self.num_local_experts > 1
            and c.gated_linear_unit
            and c.activation_func is F.silu
            and not c.add_bias_linear
            and getattr(c, "activation_func_clamp_value", None) is None
            and not getattr(c, "glu_linear_offset", 0.0)
            and not getattr(c, "moe_apply_probs_on_input", False)
            and not (getattr(c, "fp8", None) or getattr(c, "fp4", None))
        )

    def forward(self, permuted_local_hidden_states, tokens_per_expert, permuted_probs):
        if not self._grouped():
            return super().forward(permuted_local_hidden_states, tokens_per_expert, permuted_probs)
        hidden = permuted_local_hidden_states
        fc1, fc2 = self._stacks()
        offsets = torch.cumsum(torch.as_tensor(tokens_per_expert), 0).to(hidden.device, torch.int32)
        # Each rank's fc1 rows are [gate_r; up_r] (rlcore_megatron.convert): its own halves.
        # [E, out, in] stacks, used transposed: grouped_mm multiplies [T, in] by [E, in, out].
        gate, up = F.grouped_mm(hidden, fc1.transpose(1, 2), offs=offsets).chunk(2, dim=-1)
        activated = F.silu(gate) * up
        activated = (activated * permuted_probs.unsqueeze(-1)).to(activated.dtype)  # as megatron's MLP
        return F.grouped_mm(activated, fc2.transpose(1, 2), offs=offsets), None

    def _stacks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``fc1 [E, 2F/tp, h]`` and ``fc2 [E, h, F/tp]``: the local experts' weights, stacked (once per
        :func:`stacked_once`), with the gradient path back to each expert's own weight."""
        weights = (
            [expert.linear_fc1.weight for expert in self.local_experts],
            [expert.linear_fc2.weight for expert in self.local_experts],
        )
        cache = getattr(self, "_stacked_cache", None)
        if not cache:  # outside stacked_once (None), or its first forward (empty)
            with torch.no_grad():
                stacked = tuple(torch.stack(ws) for ws in weights)
            if cache is not None:
                cache.extend(stacked)
        else:
            stacked = tuple(cache)
        if not torch.is_grad_enabled() or not weights[0][0].requires_grad:
            return stacked
        return tuple(_Stacked.apply(s, *ws) for s, ws in zip(stacked, weights, strict=True))


@contextlib.contextmanager
def stacked_once(model: torch.nn.Module | Sequence[torch.nn.Module]) -> Iterator[None]:
    """Within the block, each :class:`GroupedExperts` of ``model`` stacks its weights at its first forward
    and reuses the copy; the copies are dropped on exit. Only for blocks in which no weight changes (one
    step's forward/backward passes, before the optimizer steps)."""
    chunks = model if isinstance(model, Sequence) else [model]
    layers = [m for chunk in chunks for m in chunk.modules() if isinstance(m, GroupedExperts)]
    for layer in layers:
        layer._stacked_cache = []
    try:
        yield
    finally:
        for layer in layers:
            layer._stacked_cache = None


class _Stacked(torch.autograd.Function):
    """``(stacked [E, out, in], *weights: E x [out, in]) -> stacked``: the identity on a stack of the
    weights, whose backward hands each weight its slice of the gradient.

    Where a weight has megatron's ``main_grad`` (the DDP-wrapped engine), the slices are added into the
    main grads with one add (:func:`_main_grads_as_one`) and flagged ``grad_added_to_main_grad``, so DDP's
    hook adds nothing more; the gradient returned is then an unfilled stand-in (as megatron-core's fused
    accumulation returns) that only lets the hook run. Otherwise each weight gets its slice."""

    @staticmethod
    def forward(ctx, stacked, *weights):
        ctx.weights = weights
        return stacked.detach()

    @staticmethod
    def backward(ctx, grad):
        weights = ctx.weights
        if not all(hasattr(w, "main_grad") for w in weights):
            return None, *grad.unbind(0)
        main = _main_grads_as_one([w.main_grad for w in weights])
        if main is not None:
            target, reversed_ = main
            flat = grad.reshape(len(weights), -1)
            target.add_(flat.flip(0) if reversed_ else flat)
        else:
            torch._foreach_add_([w.main_grad for w in weights], list(grad.unbind(0)))
        for w in weights:
            w.grad_added_to_main_grad = True
        return None, *(torch.empty(w.shape, dtype=grad.dtype, device=grad.device) for w in weights)


def _main_grads_as_one(grads: list[torch.Tensor]) -> tuple[torch.Tensor, bool] | None:
    """The experts' main grads as one ``[E, n]`` view of DDP's gradient buffer, when they lie there at one
    stride (megatron's buffer holds a layer's experts evenly spaced, in reverse order, fc1 and fc2
    alternating), and whether the view runs from the last expert to the first. One add into that view
    replaces an add per expert: at the 30B-A3B shape each of those moved a few MB, too little to use the
    device's bandwidth (docs/benchmarks.md). ``None`` when they do not (then an add per expert)."""
    n = grads[0].numel()
    if len(grads) < 2 or any(g.numel() != n or not g.is_contiguous() for g in grads):
        return None
    if any(g.untyped_storage().data_ptr() != grads[0].untyped_storage().data_ptr() for g in grads):
        return None
    offsets = [g.storage_offset() for g in grads]
    step = offsets[1] - offsets[0]
    if abs(step) < n or any(b - a != step for a, b in zip(offsets, offsets[1:], strict=False)):
        return None
    start = min(offsets)
    return grads[0].as_strided((len(grads), n), (abs(step), 1), start), step < 0

"""The dense SwiGLU MLP with gate and up computed as two GEMMs (``megatron.split_gate_up``).

megatron-core's ``MLP`` computes ``linear_fc1`` as one GEMM into ``[N, 2F/tp]`` (gate and up side by side)
and chunks that for the activation, so the activation's backward has to hand back the gradient of the fused
output as one ``[N, 2F/tp]`` tensor: ``dgate`` and ``dup`` concatenated. Compiled for a GPU, inductor makes
that concatenation one kernel over ``[N, 2F/tp]`` whose two halves each load the incoming gradient (and the
gate) again through masked loads (its pointwise ``cat``; on a CPU it writes the halves in place instead),
about 8 ``N*F/tp`` elements moved where the pointwise work needs 5. On a Qwen3-1.7B step on one H200 the
SwiGLU backward took 213 ms against 104 ms in the FSDP engine, whose HF MLP has separate gate and up
projections; the matmuls took the same time, and this was the 2% by which the megatron engine was slower
than the FSDP one (``megatron-qwen3-dense-tp1-h200`` in docs/benchmarks.md).

:class:`SplitGateUpMLP` keeps megatron-core's parameters exactly (``linear_fc1.weight [2F/tp, h]``, whose
rows on each tensor-parallel rank are ``[gate_r; up_r]``: ``rlcore_megatron.convert.shard``, and
``linear_fc2``), so names, checkpoints, the HF conversion, the weight stream and DDP's buffers are
unchanged. Only the forward differs: gate and up are two GEMMs on views of the weight's two row halves,
so the activation's backward yields ``dgate`` and ``dup`` as two ``[N, F/tp]`` tensors (one fused
pointwise kernel under ``torch.compile``: reads g, gate, up, writes dgate, dup), each going straight to its
own matmuls: ``dx = dgate @ W_gate + dup @ W_up`` (an mm and an addmm), and the weight's gradient
``[dgate^T x; dup^T x]``, each half written into its rows. No ``[N, 2F/tp]`` tensor exists in the forward
or the backward.

What megatron-core's ``ColumnParallelLinear`` does around its GEMM is done here the same way (see
:class:`_GateUp`): the input all-gather under sequence parallelism (only the local part is kept for the
backward, which gathers it again and reduce-scatters the input's gradient), the input-gradient sum over
tensor-parallel ranks otherwise (inside the backward, overlapping the weight-gradient GEMMs, or through
``copy_to_tensor_model_parallel_region`` where ``rlcore_megatron.compiled`` switched the layer to that
synchronous path), and the weight gradient returned to autograd once per backward, as megatron-core's
linear does without ``gradient_accumulation_fusion`` (DDP's hook then adds ``param.grad`` to
``main_grad``). Configurations it does not replicate (biases, other activations, fused weight-gradient
accumulation, CPU offloading, experts) keep megatron-core's class (:func:`splits_gate_up`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core.tensor_parallel import ColumnParallelLinear, copy_to_tensor_model_parallel_region
from megatron.core.transformer.mlp import MLP


def use_split_gate_up(model: torch.nn.Module) -> int:
    """Make every dense ``MLP`` of the built ``model`` that :func:`splits_gate_up` a :class:`SplitGateUpMLP`;
    returns how many.

    The class is swapped on the built modules rather than named in the layer spec (as
    ``rlcore_megatron.experts`` does): megatron-core's dense MLP spec is a ``ModuleSpec`` in 0.16 and a
    ``functools.partial`` in 0.19, and :class:`SplitGateUpMLP` adds no state of its own, only its forward.
    Only ``MLP`` itself: mixture-of-experts layers (their experts, and shared experts, a subclass) keep
    their own classes."""
    count = 0
    for module in model.modules():
        if type(module) is MLP and splits_gate_up(module):
            module.__class__ = SplitGateUpMLP
            count += 1
    return count


def splits_gate_up(mlp: MLP) -> bool:
    """Whether ``mlp`` is a SwiGLU :class:`SplitGateUpMLP` computes exactly as megatron-core's ``MLP``
    would: local layers, no bias, plain ``silu(gate) * up``, the weight gradient returned to autograd."""
    c, fc1 = mlp.config, mlp.linear_fc1
    return (
        type(fc1) is ColumnParallelLinear
        and not fc1.is_expert
        and fc1.bias is None
        and not fc1.gather_output
        and c.gated_linear_unit
        and c.activation_func is F.silu
        and not c.bias_activation_fusion
        and not getattr(c, "use_te_activation_func", False)
        and not getattr(c, "glu_linear_offset", 0.0)
        and getattr(c, "activation_func_clamp_value", None) is None
        and not c.gradient_accumulation_fusion
        and not c.cpu_offloading
        and not (getattr(c, "fp8", None) or getattr(c, "fp4", None))
    )


class SplitGateUpMLP(MLP):
    """megatron-core's dense SwiGLU ``MLP`` with gate and up as two GEMMs:
    ``(hidden [s(/tp), b, h]) -> (out [s(/tp), b, h], None)``, ``out = (silu(x W_g^T) * (x W_u^T)) W_2^T``
    where ``linear_fc1.weight [2F/tp, h] = [W_g; W_u]`` (``s/tp``: sequence parallelism)."""

    def forward(self, hidden_states, per_token_scale=None, **kwargs):
        if per_token_scale is not None:  # experts only; not built as this class
            return super().forward(hidden_states, per_token_scale, **kwargs)
        fc1 = self.linear_fc1
        hidden = hidden_states
        # As ColumnParallelLinear.forward: without sequence parallelism nor the input-gradient sum in the
        # linear's own backward (compiled layers: rlcore_megatron.compiled), the sum comes from this copy.
        if not (fc1.allreduce_dgrad or fc1.sequence_parallel or fc1.disable_grad_reduce):
            hidden = copy_to_tensor_model_parallel_region(hidden, group=fc1.tp_group)
        shape = hidden.shape
        gate, up = _GateUp.apply(
            hidden.reshape(-1, shape[-1]),
            fc1.weight,
            fc1.sequence_parallel,
            fc1.allreduce_dgrad,
            fc1.tp_group,
        )
        activated = F.silu(gate) * up  # megatron-core's glu(): activation_func(gate) * up
        # [s, b, F/tp] (the whole sequence under sequence parallelism), as linear_fc2 expects.
        return self.linear_fc2(activated.view(-1, *shape[1:-1], activated.shape[-1]))


class _GateUp(torch.autograd.Function):
    """``(x [T, h], weight [2f, h], sequence_parallel, allreduce_dgrad, group) -> (gate [T', f], up [T', f])``
    with ``weight = [W_g; W_u]``: megatron-core's ``LinearWithGradAccumulationAndAsyncCommunication``
    (without its fused accumulation and deferred weight gradients, unused here) with two outputs.

    ``T' = T * tp`` under sequence parallelism (``x`` is this rank's part of the tokens, all-gathered for
    the GEMMs; only the part is saved, and the backward gathers it again, overlapping the input-gradient
    GEMMs, then reduce-scatters the input's gradient). ``allreduce_dgrad``: the input's gradient is summed
    over the tensor-parallel ranks here. Outside ``torch.compile`` the collectives overlap the GEMMs that do
    not need them, as megatron-core's linear's do (the order it relies on ``CUDA_DEVICE_MAX_CONNECTIONS=1``
    for); compiled, they are synchronous, which dynamo traces (``rlcore_megatron.compiled``)."""

    @staticmethod
    def forward(ctx, x, weight, sequence_parallel, allreduce_dgrad, group):
        ctx.save_for_backward(x, weight)
        ctx.sequence_parallel, ctx.allreduce_dgrad, ctx.group = sequence_parallel, allreduce_dgrad, group
        total = _all_gather(x, group, async_op=False)[0] if sequence_parallel else x
        w_gate, w_up = weight.chunk(2)
        return torch.mm(total, w_gate.t()), torch.mm(total, w_up.t())

    @staticmethod
    def backward(ctx, dgate, dup):
        x, weight = ctx.saved_tensors
        group, want_dx, want_dw = ctx.group, ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        overlap = not torch.compiler.is_compiling()
        w_gate, w_up = weight.chunk(2)
        total, gathering = x, None
        if ctx.sequence_parallel and want_dw:
            total, gathering = _all_gather(x, group, async_op=overlap)
        # One mm and one addmm into its output: the two halves' contributions, never a [T, 2f] operand.
        dx = torch.mm(dgate, w_gate).addmm_(dup, w_up) if want_dx else None
        if gathering is not None:
            gathering.wait()
        reducing = None  # megatron-core's order: the gather done, the input gradient's exchange starts
        if dx is not None and ctx.sequence_parallel:
            dx, reducing = _reduce_scatter(dx, group, async_op=overlap)
        elif dx is not None and ctx.allreduce_dgrad:
            reducing = dist.all_reduce(dx, group=group, async_op=overlap)
        dw = _stacked_weight_grad(dgate, dup, total, weight) if want_dw else None
        if reducing is not None:
            reducing.wait()
        return dx, dw, None, None, None


def _stacked_weight_grad(dgate, dup, total, weight):
    """``[dgate^T total; dup^T total]``, ``[2f, h]``, each GEMM writing its own rows: eager through ``out=``;
    compiled as a concatenation (``out=`` into a view is not functional), which inductor lowers the same
    way, each GEMM's output laid out in the concatenated buffer (no copy kernel, as its CPU code shows)."""
    if torch.compiler.is_compiling():
        return torch.cat((torch.mm(dgate.t(), total), torch.mm(dup.t(), total)))
    grad = torch.empty(weight.shape, dtype=dgate.dtype, device=dgate.device)
    g_gate, g_up = grad.chunk(2)
    torch.mm(dgate.t(), total, out=g_gate)
    torch.mm(dup.t(), total, out=g_up)
    return grad


def _all_gather(x, group, async_op):
    """``x`` of every rank of ``group``, stacked along the first dimension (and the pending work, async)."""
    out = x.new_empty((x.shape[0] * group.size(), *x.shape[1:]))
    return out, dist.all_gather_into_tensor(out, x.contiguous(), group=group, async_op=async_op)


def _reduce_scatter(x, group, async_op):
    """The sum of ``x`` over ``group``, this rank's block of the first dimension (and the pending work)."""
    out = x.new_empty((x.shape[0] // group.size(), *x.shape[1:]))
    return out, dist.reduce_scatter_tensor(out, x, group=group, async_op=async_op)

"""Mixture-of-experts experts computed with one grouped GEMM per projection (``megatron.moe_grouped_gemm``).

megatron-core's local experts (``SequentialMLP``) run one matmul per expert over its tokens, which on an
H200 computes one Qwen3-30B-A3B expert layer at about 15 TFLOP/s; PyTorch's grouped GEMM
(``torch.nn.functional.grouped_mm``: every expert's matmul in one kernel, groups given by offsets) runs the
same layer at about 470 (``benchmarks/moe_experts_gpu.py``, docs/benchmarks.md). megatron-core's own grouped
experts need Transformer Engine or the ``grouped_gemm`` package.

:class:`GroupedExperts` keeps ``SequentialMLP``'s parameters exactly (one ``linear_fc1`` ``[2F/tp, h]`` and
``linear_fc2`` ``[h, F/tp]`` per local expert), so parameter names, the HF conversion, expert parallelism,
the distributed optimizer and checkpoints are unchanged, and stacks them for each forward: a copy of the
layer's expert weights (a few percent of the layer's time at the 30B-A3B shape), whose gradient autograd
splits back into each expert's. The experts' own linear layers communicate nothing here (megatron-core
leaves an expert layer's tensor/expert-parallel exchange to its token dispatcher), so two local grouped
matmuls compute what the linears would.
"""

from __future__ import annotations

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
        # [E, out, in] stacks, used transposed: grouped_mm multiplies [T, in] by [E, in, out].
        fc1 = torch.stack([expert.linear_fc1.weight for expert in self.local_experts])
        fc2 = torch.stack([expert.linear_fc2.weight for expert in self.local_experts])
        offsets = torch.cumsum(torch.as_tensor(tokens_per_expert), 0).to(hidden.device, torch.int32)
        # Each rank's fc1 rows are [gate_r; up_r] (rlcore_megatron.convert): its own halves.
        gate, up = F.grouped_mm(hidden, fc1.transpose(1, 2), offs=offsets).chunk(2, dim=-1)
        activated = F.silu(gate) * up
        activated = (activated * permuted_probs.unsqueeze(-1)).to(activated.dtype)  # as megatron's MLP
        return F.grouped_mm(activated, fc2.transpose(1, 2), offs=offsets), None

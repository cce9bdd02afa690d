"""A rollout whose linear weights go through FP8, as vLLM's and SGLang's ``rollout.quantization: fp8`` do,
on any device torch casts to ``float8_e4m3fn`` on (the CPU included): for the tests of what a quantized
rollout does to the post-sync check, where no FP8 kernels exist.

:class:`FP8SimHF` is core's HF rollout with every decoder ``nn.Linear`` weight rounded through e4m3 at
start and after every weight load, with one scale per tensor (``amax / 448``, vLLM's online FP8), and
each linear layer's input rounded through e4m3 with a scale per token (the engines' dynamic activation
scales); the embeddings, norms and the output layer stay as they are (both engines keep them 16-bit).
The products are then computed in the rollout's dtype from the rounded operands, where a real engine
accumulates an FP8 GEMM in fp32: the rounding of both operands is FP8's, the accumulation is not.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from rlcore.api import WeightBucket
from rlcore.rollout.hf import HFRollout

#: The largest finite value of ``float8_e4m3fn``.
E4M3_MAX = 448.0


def fp8_round_trip(x: torch.Tensor, per_row: bool = False) -> torch.Tensor:
    """``x`` quantized to e4m3 and back, in its own dtype: one scale for the tensor, or (``per_row``) one
    per row of its last dimension."""
    w = x.float()
    amax = w.abs().amax(dim=-1, keepdim=True) if per_row else w.abs().max()
    scale = amax.clamp(min=1e-12) / E4M3_MAX
    return ((w / scale).to(torch.float8_e4m3fn).float() * scale).to(x.dtype)


def _quantize_input(module: torch.nn.Module, args: tuple) -> tuple:
    return (fp8_round_trip(args[0], per_row=True), *args[1:])


def _linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The decoder's linear layers: every ``nn.Linear`` but the output layer."""
    output = model.get_output_embeddings()
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not output]


@torch.no_grad()
def quantize_linears(model: torch.nn.Module) -> int:
    """Round every decoder linear weight of ``model`` through FP8 in place (not the output layer);
    returns how many."""
    linears = _linears(model)
    for module in linears:
        module.weight.copy_(fp8_round_trip(module.weight))
    return len(linears)


class FP8SimHF(HFRollout):
    """Core's HF rollout with FP8-rounded linear weights (see the module docstring)."""

    quantizations = ("fp8",)

    def __init__(self, spec, config, platform):
        super().__init__(spec, config, platform)
        if spec.quantization is not None:
            quantize_linears(self.model)
            for module in _linears(self.model):
                module.register_forward_pre_hook(_quantize_input)

    def load_weights(self, buckets: Iterable[WeightBucket]) -> None:
        super().load_weights(buckets)
        if self.spec.quantization is not None:  # quantized again at every sync, as the real engines do
            quantize_linears(self.model)

"""How evenly a mixture of experts spreads its tokens: per-layer expert load from the routers.

A forward hook on each MoE layer's router counts the tokens it sends to each expert (its routing map
``[tokens, num_experts]``, top-k entries set). After a training step the counts of every rank are summed
(each token is routed once: on tensor-parallel rank 0 of its replica, or on every tensor-parallel rank
under sequence parallelism, where each routes its own part of the sequence) and reported as the busiest
expert's share against an even spread: ``max_e load / mean_e load`` (1.0 is perfectly balanced, ``E``
means one expert took every token). The counts include padding tokens, which the experts compute too
(none with ``megatron.use_remove_padding``), and a recomputed forward counts twice: ratios are
unaffected.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class ExpertLoad:
    """Token counts per (global layer, expert) of this rank's MoE layers, from hooks on their routers."""

    def __init__(
        self, module: torch.nn.Module, num_layers: int, num_experts: int, device, *, counts_here: bool
    ):
        #: ``[num_layers, num_experts]``: tokens routed since the last :meth:`reset`.
        self.counts = torch.zeros(num_layers, num_experts, dtype=torch.float64, device=device)
        self.layers = sorted(layer.layer_number - 1 for layer in module.decoder.layers)
        self.counts_here = counts_here
        for layer in module.decoder.layers:
            layer.mlp.router.register_forward_hook(self._hook(layer.layer_number - 1))

    def _hook(self, index: int):
        def count(module, inputs, output) -> None:
            _, routing_map = output  # probs [tokens, E], routing_map [tokens, E] (bool)
            self.counts[index] += routing_map.detach().sum(0).to(self.counts.dtype)

        return count

    def reset(self) -> None:
        self.counts.zero_()

    def metrics(self) -> dict[str, float]:
        """``moe/load_max_over_mean/layer_<i>`` for every layer and their mean ``moe/load_max_over_mean``,
        over the whole step's tokens (a collective: every rank calls it, every rank gets the same)."""
        total = self.counts if self.counts_here else torch.zeros_like(self.counts)
        if dist.is_initialized() and dist.get_world_size() > 1:
            total = total.clone()
            dist.all_reduce(total)
        mean = total.mean(dim=1)
        ratio = torch.where(mean > 0, total.max(dim=1).values / mean.clamp(min=1e-12), torch.ones_like(mean))
        values = ratio.tolist()
        out = {f"moe/load_max_over_mean/layer_{i}": v for i, v in enumerate(values)}
        out["moe/load_max_over_mean"] = sum(values) / len(values)
        return out

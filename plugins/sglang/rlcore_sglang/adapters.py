"""The LoRA adapter an SGLang rollout generates with (``RolloutSpec.lora`` set: the policy trains one).

Why not merged weights: merging ``W + scale * B A`` into bf16 weights rounds the sum to bf16, whose step
near ``|W|`` (2^-8 of it) is larger than most of an early adapter's ``scale * B A``; the trainer computes
``W x + scale * B (A x)`` and keeps it. On SmolLM2 with a rank-16 adapter the merged rollout's gap to the
trainer climbed to 0.14-0.19 against 0.03 in full fine-tuning (issue 53). SGLang serves adapters over the
unchanged base (``enable_lora``, per-request ``lora_path``), as vLLM does.

Each adapter sync writes the streamed ``lora_A``/``lora_B`` tensors as a PEFT folder (a few MB), unloads
the previous adapter and loads the new one under a new name, with the engine parked; later requests name
it. Until the first sync the engine generates with the base model, which is what a fresh adapter
(``B = 0``) computes. SGLang has no CPU build, so this runs on GPUs only
(``plugins/sglang/tests/test_engine_gpu.py``).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from rlcore.adapters import adapter_tensors, target_names, write_peft_adapter
from rlcore.api import RolloutSpec
from rlcore.api.train_engine import ALL_LINEAR


def serves_adapters(spec: RolloutSpec) -> bool:
    """Whether the engine generates with the adapter (else the run sends it merged weights): whenever the
    policy trains one, unless ``actor.lora.sync: merged`` (SGLang's LoRA kernels run on every GPU
    dtype it serves; its rank-16 decode costs are in docs/benchmarks.md)."""
    return spec.lora is not None and spec.lora_sync != "merged"


def engine_kwargs(spec: RolloutSpec) -> dict[str, Any]:
    """``sglang.Engine`` arguments that make room for one adapter of ``spec.lora``'s rank and targets."""
    targets = spec.lora.target_modules
    return {
        "enable_lora": True,
        "max_lora_rank": spec.lora.rank,
        # A list even for "all": SGLang 0.5.16 iterates the value (a bare "all" reads as modules a, l, l).
        "lora_target_modules": ["all"] if targets == ALL_LINEAR else list(targets),
        # The new adapter is loaded after the old one is unloaded: one at a time.
        "max_loras_per_batch": 1,
    }


class AdapterSlot:
    """The current adapter: its name in SGLang (None before the first sync) and its folder."""

    def __init__(self, spec: RolloutSpec):
        self.spec = spec
        self.name: str | None = None
        self._root = Path(tempfile.mkdtemp(prefix="rlcore-sglang-lora-"))
        self._version = 0
        self._folder: Path | None = None

    def write(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> tuple[str, Path]:
        """Write a whole adapter stream as the next version's PEFT folder; its ``(name, folder)``."""
        named = adapter_tensors(tensors, "sglang")
        if self.spec.lora.target_modules != ALL_LINEAR:
            extra = sorted(set(target_names(list(named))) - set(self.spec.lora.target_modules))
            if extra:
                raise ValueError(
                    f"sglang rollout: the adapter adapts {extra}, which the engine made no room for "
                    f"(actor.lora.target_modules: {list(self.spec.lora.target_modules)})"
                )
        self._version += 1
        folder = self._root / f"v{self._version}"
        write_peft_adapter(folder, named, self.spec.lora, self.spec.model_path)
        return f"rlcore-v{self._version}", folder

    async def swap(self, manager: Any, name: str, folder: Path) -> None:
        """In SGLang's tokenizer ``manager``: unload the current adapter, load ``folder`` as ``name``
        (requests held back meanwhile: call inside the engine loop's exclusive block)."""
        from sglang.srt.managers.io_struct import LoadLoRAAdapterReqInput, UnloadLoRAAdapterReqInput

        if self.name is not None:
            result = await manager.unload_lora_adapter(UnloadLoRAAdapterReqInput(lora_name=self.name), None)
            _raise_unless_ok(result, f"unload the LoRA adapter {self.name!r}")
            self.name = None
            if self._folder is not None:
                shutil.rmtree(self._folder, ignore_errors=True)
        result = await manager.load_lora_adapter(
            LoadLoRAAdapterReqInput(lora_name=name, lora_path=str(folder)), None
        )
        _raise_unless_ok(result, f"load the LoRA adapter written to {folder}")
        self.name, self._folder = name, folder

    def close(self) -> None:
        shutil.rmtree(self._root, ignore_errors=True)


def _raise_unless_ok(result: Any, what: str) -> None:
    """SGLang answers adapter requests with a ``LoRAUpdateOutput`` (``success``, ``error_message``)."""
    if not getattr(result, "success", False):
        message = getattr(result, "error_message", None) or result
        raise RuntimeError(f"sglang rollout: SGLang could not {what}: {message}")

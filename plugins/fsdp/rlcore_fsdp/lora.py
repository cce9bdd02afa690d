"""LoRA adapters on the FSDP engine, through PEFT.

:func:`add_adapter` injects PEFT's LoRA layers into the Hugging Face model in place (the model keeps its
class, so :class:`rlcore_fsdp.model.HeadedModel` and FSDP see the same structure) and freezes everything
but the adapter. An adapted linear ``q_proj`` then holds ``q_proj.base_layer.weight [out, in]`` (frozen),
``q_proj.lora_A.default.weight [r, in]`` and ``q_proj.lora_B.default.weight [out, r]``, and computes
``x W^T + scale * (x A^T) B^T``.

What leaves the engine is named as Hugging Face and PEFT name it, without PEFT's internal layout:

- :func:`merged`: the full weights, ``q_proj.weight = W + scale * B A`` (for rollouts that cannot load
  adapters, and for the exported model folder);
- :func:`rlcore.adapters.adapter_name`: ``<module>.lora_A.weight`` / ``<module>.lora_B.weight`` (the
  adapter-only sync, and the PEFT folder :func:`rlcore.adapters.write_peft_adapter` writes).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
import torch.nn as nn
from rlcore.api import LoraSpec

ADAPTER = "default"  # PEFT's adapter name; one adapter per engine
_BASE, _A, _B = ".base_layer.", f".lora_A.{ADAPTER}.", f".lora_B.{ADAPTER}."
#: The folder inside an exported model folder that holds the PEFT adapter.
ADAPTER_FOLDER = "adapter"


def add_adapter(model: nn.Module, spec: LoraSpec, seed: int) -> dict[str, float]:
    """Wrap ``spec.target_modules`` of ``model`` with LoRA (``A`` random from ``seed``, ``B`` zero, so the
    adapted model starts as the base) and freeze every other parameter. Returns ``{module name: scale}``
    of the adapted modules."""
    try:
        from peft import LoraConfig, inject_adapter_in_model
        from peft.tuners.lora import LoraLayer
    except ImportError as exc:
        raise ImportError(
            "actor.lora needs the peft package: pip install 'rlcore-fsdp[lora]' (make setup installs it)"
        ) from exc
    targets = spec.target_modules
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        target_modules=targets if isinstance(targets, str) else list(targets),
        lora_dropout=spec.dropout,
        bias="none",
    )
    torch.manual_seed(seed)  # every rank draws the same A
    try:
        inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    except ValueError as exc:  # PEFT: "Target modules {...} not found in the base model"
        raise ValueError(
            f"actor.lora.target_modules={targets!r}: {exc}. Name linear layers of "
            f"{type(model).__name__} (e.g. q_proj, v_proj) or use all-linear"
        ) from exc
    for name, param in model.named_parameters():
        param.requires_grad_(".lora_A." in name or ".lora_B." in name)
    scales = {
        name: float(module.scaling[ADAPTER])
        for name, module in model.named_modules()
        if isinstance(module, LoraLayer) and ADAPTER in module.scaling
    }
    if not scales:
        raise ValueError(
            f"actor.lora.target_modules={targets!r} matched no linear layer of {type(model).__name__}"
        )
    return scales


def set_adapter_enabled(model: nn.Module, enabled: bool) -> None:
    """Switch every LoRA layer on or off (off: the frozen base model computes)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            module.enable_adapters(enabled)


def split_name(name: str) -> tuple[str, str | None]:
    """A state-dict name -> ``(module, part)``, ``part`` one of ``weight``/``bias`` (of the base layer),
    ``A``, ``B``; ``(name, None)`` for a parameter outside any adapted module."""
    for marker, part in ((_A, "A"), (_B, "B")):
        if marker in name and name.endswith("weight"):
            return name.split(marker)[0], part
    if _BASE in name:
        module, rest = name.split(_BASE)
        return module, rest
    return name, None


def merged(
    named: Iterable[tuple[str, torch.Tensor | None]], scales: dict[str, float]
) -> Iterator[tuple[str, torch.Tensor | None]]:
    """State-dict ``(name, tensor)`` pairs with each adapter folded into its base weight:
    ``<module>.weight = W + scale * B A`` (computed in at least fp32, returned in ``W``'s dtype) and
    ``<module>.bias`` as it was; every other pair (``None`` tensors included) passes through in order."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named:
        module, part = split_name(name)
        if part is None:
            yield name, tensor
        elif part == "bias":
            yield f"{module}.bias", tensor
        else:
            entry = pending.setdefault(module, {})
            entry[part] = tensor
            if len(entry) == 3:
                del pending[module]
                base = entry["weight"]
                wide = torch.promote_types(base.dtype, torch.float32)  # bf16 merges in fp32, fp64 in fp64
                delta = entry["B"].to(wide) @ entry["A"].to(wide)
                yield f"{module}.weight", (base.to(wide) + scales[module] * delta).to(base.dtype)
    if pending:
        raise RuntimeError(f"LoRA modules without all of base weight, A and B: {sorted(pending)[:3]}")

"""LoRA adapters as they travel between engines: the stream's names and the PEFT folder format.

A train engine with :attr:`rlcore.api.TrainEngine.supports_lora` streams an adapter as
``<module>.lora_A.weight [rank, in]`` and ``<module>.lora_B.weight [out, rank]`` (``<module>`` the Hugging
Face name of the adapted linear layer, ``model.layers.0.self_attn.q_proj``); the adapted layer computes
``x W^T + (alpha / rank) * (x A^T) B^T``. :func:`write_peft_adapter` writes such tensors as the folder PEFT
saves (``adapter_config.json``, ``adapter_model.safetensors`` with ``base_model.model.``-prefixed names),
which ``peft.PeftModel.from_pretrained`` and vLLM's and SGLang's LoRA loaders read.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import torch

from rlcore.api.train_engine import LoraSpec

_PARTS = (".lora_A.weight", ".lora_B.weight")


def adapter_name(module: str, part: str) -> str:
    """``("model.layers.0.self_attn.q_proj", "A")`` -> ``model.layers.0.self_attn.q_proj.lora_A.weight``."""
    return f"{module}.lora_{part}.weight"


def is_adapter_name(name: str) -> bool:
    """Whether a weight-stream name is an adapter tensor's."""
    return name.endswith(_PARTS)


def split_stream(buckets: Iterable[list]) -> tuple[Iterator[list], bool] | None:
    """A weight stream (buckets of ``(name, tensor)``) as ``(the same buckets, whether it is an adapter
    stream)``, told by its first name; ``None`` for an empty stream (nothing to load)."""
    buckets = iter(buckets)
    first = next(buckets, None)
    if first is None:
        return None
    return itertools.chain([first], buckets), bool(first) and is_adapter_name(first[0][0])


def adapter_tensors(tensors: Iterable[tuple[str, torch.Tensor]], engine: str) -> dict[str, torch.Tensor]:
    """A whole adapter stream's tensors by name; an error naming ``engine`` if any is not an adapter's."""
    named = dict(tensors)
    stray = [name for name in named if not is_adapter_name(name)]
    if stray:
        raise ValueError(
            f"{engine} rollout: an adapter stream holds non-adapter tensors {stray[:3]}; a sync sends either "
            "the adapter or the full weights"
        )
    return named


def target_names(names: Mapping[str, object] | list[str]) -> list[str]:
    """The adapted modules' own names (``q_proj``, ``v_proj`` ...) from module or adapter-tensor names,
    as PEFT's ``target_modules`` lists them."""
    modules = [n.removesuffix(_PARTS[0]).removesuffix(_PARTS[1]) for n in names]
    return sorted({m.rsplit(".", 1)[-1] for m in modules})


def write_peft_adapter(
    folder: Path, tensors: Mapping[str, torch.Tensor], spec: LoraSpec, base_model: str
) -> None:
    """Write ``tensors`` (named as :func:`adapter_name` names them) as a PEFT LoRA adapter folder."""
    from safetensors.torch import save_file

    unknown = [name for name in tensors if not is_adapter_name(name)]
    if unknown:
        raise ValueError(f"not adapter tensors (<module>.lora_A/B.weight): {unknown[:3]}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": spec.dropout,
        "target_modules": target_names(list(tensors)),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(
        {f"base_model.model.{name}": t.detach().cpu().contiguous() for name, t in tensors.items()},
        str(folder / "adapter_model.safetensors"),
        metadata={"format": "pt"},
    )

"""Reading HF safetensors checkpoints into this rank's Megatron shards, and writing HF model folders.

Each rank reads only the HF tensors its own parameters are made of (``safe_open`` is lazy), builds the
full Megatron tensor with :mod:`rlcore_megatron.convert` and keeps its tensor-parallel part.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from rlcore_megatron.architecture import ModelShape
from rlcore_megatron.convert import ParamMap, shard, to_mcore

#: Files of an HF model folder that hold weights (everything else is copied by :func:`write_hf_folder`).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack")
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


class HFCheckpoint:
    """Lazy access to the tensors of an HF model folder (``model.safetensors`` or a sharded index)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        index = self.path / "model.safetensors.index.json"
        single = self.path / "model.safetensors"
        if index.exists():
            self._where = {k: self.path / v for k, v in json.loads(index.read_text())["weight_map"].items()}
        elif single.exists():
            with safe_open(str(single), framework="pt") as f:
                self._where = dict.fromkeys(f.keys(), single)
        else:
            raise FileNotFoundError(
                f"no model.safetensors or model.safetensors.index.json in {self.path}; the megatron engine "
                f"loads safetensors checkpoints (re-save the model with save_pretrained(safe_serialization=True))"
            )
        self._open: dict[Path, object] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise KeyError(f"{self.path} has no tensor {name!r}")
        file = self._where[name]
        if file not in self._open:
            self._open[file] = safe_open(str(file), framework="pt")
        return self._open[file].get_tensor(name)


def local_to_global(name: str, layer_offset: int, expert_offset: int = 0) -> str:
    """``decoder.layers.<local>.…`` on a pipeline stage -> the global layer number; and
    ``….local_experts.<local>.…`` on an expert-parallel rank -> the global expert number."""
    parts = name.split(".")
    if len(parts) > 2 and parts[0] == "decoder" and parts[1] == "layers":
        parts[2] = str(int(parts[2]) + layer_offset)
        if expert_offset and "local_experts" in parts:
            at = parts.index("local_experts") + 1
            parts[at] = str(int(parts[at]) + expert_offset)
    return ".".join(parts)


@torch.no_grad()
def load_into(
    model: torch.nn.Module,
    maps: Iterable[ParamMap],
    ckpt: HFCheckpoint,
    shape: ModelShape,
    *,
    layer_offset: int,
    tp_rank: int,
    tp_size: int,
    init_missing,
    expert_offset: int = 0,
) -> list[str]:
    """Fill every parameter of ``model`` (this stage, this TP rank) from ``ckpt``.

    ``init_missing(param)`` initialises an optional parameter the checkpoint lacks (a fresh value
    head). ``expert_offset``: the global number of this rank's first expert. Returns the Megatron names so
    initialised. Raises if a required tensor is missing, or if a
    parameter has no mapping (an architecture this converter does not know).
    """
    by_name = {pm.mcore: pm for pm in maps}
    initialised = []
    for local_name, param in model.named_parameters():
        name = local_to_global(local_name, layer_offset, expert_offset)
        pm = by_name.get(name)
        if pm is None:
            raise ValueError(f"Megatron parameter {name!r} has no Hugging Face counterpart in the converter")
        if not all(n in ckpt for n in pm.hf):
            if pm.optional:
                init_missing(param)
                initialised.append(name)
                continue
            missing = [n for n in pm.hf if n not in ckpt]
            raise KeyError(f"{ckpt.path} lacks {missing}, needed for Megatron parameter {name!r}")
        full = to_mcore(pm, [ckpt.get(n) for n in pm.hf], shape)
        part = shard(pm, full, tp_rank, tp_size)
        if part.shape != param.shape:
            raise ValueError(
                f"{name}: the checkpoint gives shape {tuple(part.shape)} for this rank, the model has "
                f"{tuple(param.shape)} (does config.json match the weights?)"
            )
        param.copy_(part)
    return initialised


def write_hf_folder(
    path: str | Path,
    tensors: Iterable[tuple[str, torch.Tensor]],
    source: str | Path,
    config_updates: dict,
    max_shard_bytes: int = 4 * 2**30,
) -> None:
    """Write ``tensors`` as safetensors shards (with an index when more than one) plus every non-weight
    file of the HF folder ``source`` (tokenizer, generation config), and ``config.json`` from
    ``source`` updated with ``config_updates`` (its ``dtype`` goes to the key the source uses)."""
    path, source = Path(path), Path(source)
    path.mkdir(parents=True, exist_ok=True)
    for old in list(path.glob("model*.safetensors")) + [path / n for n in _WEIGHT_INDEXES]:
        old.unlink(missing_ok=True)
    for item in source.iterdir():
        if item.is_file() and not item.name.endswith(_WEIGHT_SUFFIXES) and item.name not in _WEIGHT_INDEXES:
            shutil.copy2(item, path / item.name)
    config = json.loads((source / "config.json").read_text())
    if "dtype" in config_updates:
        # transformers 5 writes "dtype", earlier versions "torch_dtype": update whichever is there.
        dtype = config_updates.pop("dtype")
        for key in [k for k in ("dtype", "torch_dtype") if k in config] or ["torch_dtype"]:
            config[key] = dtype
    config.update(config_updates)
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    # Shards are written as they fill (the whole model never sits in memory) and renamed at the end,
    # when their count is known.
    written: list[tuple[Path, list[str], int]] = []
    part: dict[str, torch.Tensor] = {}
    used = 0

    def flush() -> None:
        nonlocal part, used
        if part:
            tmp = path / f"model-part{len(written) + 1:05d}.safetensors.tmp"
            save_file(part, str(tmp), metadata={"format": "pt"})
            written.append((tmp, list(part), used))
        part, used = {}, 0

    for name, tensor in tensors:
        size = tensor.numel() * tensor.element_size()
        if used + size > max_shard_bytes:
            flush()
        part[name] = tensor.contiguous().cpu()
        used += size
    flush()
    if len(written) == 1:
        written[0][0].rename(path / "model.safetensors")
        return
    weight_map = {}
    for i, (tmp, names, _) in enumerate(written, 1):
        file = f"model-{i:05d}-of-{len(written):05d}.safetensors"
        tmp.rename(path / file)
        weight_map.update(dict.fromkeys(names, file))
    index = {"metadata": {"total_size": sum(n for *_, n in written)}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")

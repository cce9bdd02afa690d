"""Writing state to disk: sharded checkpoints (``torch.distributed.checkpoint``) and HF model folders.

Both are written into a sibling temporary folder and renamed into place only when complete, so a crash
mid-write never leaves a half-written checkpoint under the final name (a resume would load it).

A checkpoint is loaded as data only: DCP's own reader unpickles the folder's index and every non-tensor
value, so a checkpoint someone hands you could run code; :mod:`rlcore.safe_dcp` reads both without that.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from rlcore.safe_dcp import SafeFileSystemReader, SafeLoadPlanner, check_folder

#: Files copied from the model folder into an exported HF folder (tokenizer and generation defaults).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)
#: Largest safetensors file of an exported folder; bigger models are split with an index, as HF does.
MAX_SHARD_BYTES = 5 * 2**30
METADATA_FILE = "rlcore_checkpoint.json"


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _is_rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _replace(tmp: Path, final: Path) -> None:
    """Move the finished ``tmp`` folder to ``final``, replacing an older one (rank 0 only)."""
    old = final.with_name(final.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    if old.exists():
        shutil.rmtree(old)


def write_atomically(path: str, write: Callable[[Path], None], rank0_only: bool) -> None:
    """Run ``write(tmp_folder)`` (on every rank, or rank 0 only), then rename the folder to ``path``.

    Collective when a process group exists; ``path``'s parent must be shared by all ranks.
    """
    final = Path(path)
    tmp = final.with_name(final.name + ".tmp")
    if _is_rank0():
        final.parent.mkdir(parents=True, exist_ok=True)
        if tmp.exists():  # left by a crash
            shutil.rmtree(tmp)
        tmp.mkdir()
    _barrier()
    if _is_rank0() or not rank0_only:
        write(tmp)
    _barrier()
    if _is_rank0():
        _replace(tmp, final)
    _barrier()


def save_sharded(state: dict, path: str, metadata: Mapping) -> None:
    """``dcp.save`` of ``state`` (each rank writes its shards) plus a JSON note, atomically at ``path``."""

    def write(tmp: Path) -> None:
        dcp.save(state, checkpoint_id=str(tmp))
        if _is_rank0():
            (tmp / METADATA_FILE).write_text(json.dumps(dict(metadata), indent=2))

    write_atomically(path, write, rank0_only=False)


def load_sharded(state: dict, path: str) -> dict:
    """Fill ``state`` (the structure :func:`save_sharded` got, holding this rank's shards) from ``path``."""
    if not (Path(path) / ".metadata").is_file():
        raise FileNotFoundError(
            f"no checkpoint at {path!r} (no .metadata file); pass a folder written by save_checkpoint"
        )
    # Checked first so that a tampered file fails with its own name and what to do (inside dcp.load the
    # error would be buried in a per-rank report); the safe reader and planner then read it as data too.
    check_folder(path)
    dcp.load(state, storage_reader=SafeFileSystemReader(path), planner=SafeLoadPlanner())
    return (
        json.loads((Path(path) / METADATA_FILE).read_text()) if (Path(path) / METADATA_FILE).is_file() else {}
    )


def _shards(tensors: Mapping[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    used = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        if shards[-1] and used + size > max_bytes:
            shards.append({})
            used = 0
        shards[-1][name] = tensor
        used += size
    return shards


def write_hf_folder(
    folder: Path,
    tensors: Mapping[str, torch.Tensor],
    config,
    model_path: str,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> None:
    """Write ``config.json``, safetensors (one file or HF-style shards with an index) and the tokenizer
    files found in ``model_path`` into ``folder``."""
    from safetensors.torch import save_file

    config.save_pretrained(str(folder))
    shards = _shards(tensors, max_shard_bytes)
    if len(shards) == 1:
        save_file(
            {k: v.contiguous() for k, v in shards[0].items()},
            str(folder / "model.safetensors"),
            {"format": "pt"},
        )
    else:
        weight_map = {}
        for i, shard in enumerate(shards, start=1):
            name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file({k: v.contiguous() for k, v in shard.items()}, str(folder / name), {"format": "pt"})
            weight_map.update(dict.fromkeys(shard, name))
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    for name in TOKENIZER_FILES:
        source = Path(model_path) / name
        if source.is_file():
            shutil.copy2(source, folder / name)

"""Training checkpoints with megatron-core's distributed checkpointing (``torch_dist`` format).

Every rank writes its own shards in parallel. The distributed optimizer's state is saved in the
``dp_reshardable`` layout, so a checkpoint loads back with the same tensor/pipeline sizes and any
data-parallel size. Plain values (LR schedule, step counter) go into the common part.

A checkpoint is checked before megatron-core reads it: its DCP reader unpickles the index and every
non-tensor value, so a checkpoint someone hands you could run code. :func:`check_safe` reads those and the
common part (``common.pt``) as data only first, and refuses anything else.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing
from rlcore.safe_dcp import check_folder, load_value

from rlcore_megatron.optimizer import torch_adams

_OPTIMIZER_FORMAT = {"distrib_optim_sharding_type": "dp_reshardable"}


def _torch_adam_steps(optimizer) -> list[float | None]:
    steps = []
    for adam in torch_adams(optimizer):
        values = (
            {float(st["step"]) for st in adam.state.values() if "step" in st} if adam is not None else set()
        )
        steps.append(values.pop() if len(values) == 1 else None)
    return steps


def _step(group: dict, param: torch.Tensor, value: float) -> torch.Tensor:
    """A step count where torch's Adam keeps it for ``group``: on the parameter's device for the fused
    (``rlcore_megatron.optimizer.fuse_adam``) and capturable forms, on the host otherwise."""
    on_device = group.get("fused") or group.get("capturable")
    return torch.tensor(value, dtype=torch.float32, device=param.device if on_device else "cpu")


def _materialise_torch_adam_state(optimizer) -> None:
    """Give a never-stepped torch Adam the per-parameter state its first step would create:
    megatron-core's distributed optimizer reads it while building the state dict to load into."""
    for adam in torch_adams(optimizer):
        for group in adam.param_groups if adam is not None else []:
            for p in group["params"]:
                if not adam.state[p]:
                    adam.state[p].update(
                        step=_step(group, p, 0.0), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p)
                    )


def _restore_torch_adam_steps(optimizer, steps: list[float | None]) -> None:
    """Set torch Adam's step count from the checkpoint's common part, one tensor per parameter.

    megatron-core 0.16-0.19 loses it on this path: the ``dp_reshardable`` parameter state copies the
    step of the state being loaded *into*, and the optimizer state dict puts one shared step tensor
    into every parameter's state, which torch's multi-tensor Adam then increments once per
    parameter. Either corrupts Adam's bias correction after a resume.
    """
    for adam, step in zip(torch_adams(optimizer), steps, strict=True):
        if adam is None or step is None:
            continue
        for group in adam.param_groups:
            for p in group["params"]:
                if p in adam.state:
                    adam.state[p]["step"] = _step(group, p, step)


def _sharded_state(model, optimizer, *, loading: bool) -> dict:
    state = {"model": model.sharded_state_dict()}
    if optimizer is not None:
        state["optimizer"] = optimizer.sharded_state_dict(
            state, is_loading=loading, metadata=_OPTIMIZER_FORMAT
        )
    return state


def save(path: str | Path, model, optimizer, common: dict) -> None:
    """Write ``model`` (the unwrapped stage model), ``optimizer`` (or None) and ``common`` under
    ``path/dist`` (collective)."""
    target = Path(path) / "dist"
    if dist.get_rank() == 0:
        target.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    state = _sharded_state(model, optimizer, loading=False)
    state["common"] = dict(common, torch_adam_steps=_torch_adam_steps(optimizer) if optimizer else [])
    dist_checkpointing.save(state, str(target))
    dist.barrier()


def check_safe(target: Path) -> None:
    """Refuse (``rlcore.safe_dcp.UnsafeCheckpointError``, naming the file) a ``dist`` folder whose pickles
    would call anything but plain-data constructors. megatron-core's own reader then loads the same files:
    the DCP index and byte items with ``pickle`` / ``torch.load(weights_only=False)``, ``common.pt`` with
    torch's default (weights-only unless ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` is set), so they are
    checked here whatever the environment says."""
    check_folder(target)
    for file in sorted(target.rglob("*.pt")):  # common.pt, and object shards where a format has them
        with open(file, "rb") as data:
            load_value(data, str(file))


def common(path: str | Path) -> dict:
    """The common part of the checkpoint at ``path`` (``{}`` where there is none), read as data only."""
    file = Path(path) / "dist" / "common.pt"
    if not file.is_file():
        return {}
    with open(file, "rb") as data:
        value = load_value(data, str(file))
    return value.get("common", {}) if isinstance(value, dict) else {}


def load(path: str | Path, model, optimizer) -> dict:
    """Restore what :func:`save` wrote into ``model`` and ``optimizer``; return ``common`` (collective)."""
    target = Path(path) / "dist"
    if not target.is_dir():
        raise FileNotFoundError(
            f"no Megatron checkpoint at {target} (written by MegatronEngine.save_checkpoint)"
        )
    check_safe(target)
    if optimizer is not None:
        _materialise_torch_adam_state(optimizer)
    state = _sharded_state(model, optimizer, loading=True)
    state["common"] = {}
    loaded = dist_checkpointing.load(state, str(target))
    model.load_state_dict(loaded["model"])
    if optimizer is not None:
        # megatron-core 0.16 copies fp32 main params into views of leaf parameters here.
        with torch.no_grad():
            optimizer.load_state_dict(loaded["optimizer"])
        _restore_torch_adam_steps(optimizer, loaded["common"]["torch_adam_steps"])
    return loaded["common"]

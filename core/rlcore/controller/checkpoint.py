"""Run checkpoints on disk: written atomically, found again by ``trainer.resume``.

Layout under the run directory::

    checkpoints/
      step_4/
        actor/              role.save_checkpoint (the engine's own layout)
        critic/
        trainer_state.pt    step, data-loader position, RNG states, KL controller, metrics history
        config.yaml         the resolved config of the run (``rlcore export`` rebuilds engines from it)
      latest                "step_4": written last, so it only ever names a complete checkpoint

A checkpoint is written into ``step_N.tmp`` and renamed to ``step_N`` once every role and the trainer
state are on disk; a run killed while saving leaves a ``.tmp`` folder that resume ignores (and the next
save of that step replaces). Engines write from their own processes: on several nodes ``output_dir``
must be a shared file system.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

CHECKPOINTS_DIR = "checkpoints"
LATEST_FILE = "latest"
STATE_FILE = "trainer_state.pt"
CONFIG_FILE = "config.yaml"
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(FileNotFoundError):
    """A checkpoint is missing or incomplete; the message names the path and what to do."""


def step_dir(run_dir: str | os.PathLike, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR / f"step_{step}"


def save_checkpoint(
    run_dir: str | os.PathLike,
    step: int,
    save_roles: Mapping[str, Callable[[str], None]],
    state: Mapping[str, Any],
    config_yaml: str,
) -> Path:
    """Write checkpoint ``step``: each ``save_roles[name](dir)`` writes role ``name`` under ``dir``, then
    the trainer ``state`` (anything ``torch.save`` takes) and the config. Returns the final folder."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    final = root / f"step_{step}"
    tmp = root / f"step_{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, save in save_roles.items():
        save(str((tmp / name).resolve()))
    torch.save(dict(state), tmp / STATE_FILE)
    (tmp / CONFIG_FILE).write_text(config_yaml)
    if final.exists():  # the same step saved again (a resumed run that re-ran it): replace it whole
        old = root / f"step_{step}.old"
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)
    _write_atomic(root / LATEST_FILE, final.name + "\n")
    return final


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _complete(folder: Path) -> bool:
    return (folder / STATE_FILE).is_file()


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint of a run, or ``None``.

    Trusts the ``latest`` pointer when it names a complete folder; otherwise (pointer lost, or a folder
    removed by hand) takes the highest complete ``step_N``.
    """
    root = Path(run_dir) / CHECKPOINTS_DIR
    pointer = root / LATEST_FILE
    if pointer.is_file():
        named = root / pointer.read_text().strip()
        if named.is_dir() and _complete(named):
            return named
    steps = []
    if root.is_dir():
        for child in root.iterdir():
            match = _STEP_DIR.match(child.name)
            if match and child.is_dir() and _complete(child):
                steps.append((int(match.group(1)), child))
    return max(steps)[1] if steps else None


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint folder from a path to it, to a run's ``checkpoints/`` folder, or to a run directory
    (its latest checkpoint)."""
    path = Path(path)
    if _complete(path):
        return path
    for run_dir in (path, path.parent):
        if (run_dir / CHECKPOINTS_DIR).is_dir() and (path.name == CHECKPOINTS_DIR or run_dir == path):
            found = latest_checkpoint(run_dir)
            if found is not None:
                return found
    raise CheckpointError(
        f"{str(path)!r} is not a complete checkpoint (no {STATE_FILE}), nor a run directory or checkpoints/ "
        f"folder holding one. Pass <run_dir>/{CHECKPOINTS_DIR}/step_N or the run directory."
    )


def load_state(checkpoint: str | os.PathLike) -> dict[str, Any]:
    """The trainer state saved in ``checkpoint`` (written by this module, so unpickling is trusted)."""
    file = Path(checkpoint) / STATE_FILE
    if not file.is_file():
        raise CheckpointError(f"checkpoint {str(checkpoint)!r} has no {STATE_FILE}; it is incomplete")
    return torch.load(file, map_location="cpu", weights_only=False)


# -- RNG state ------------------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch RNG states of this (the driver) process. The driver computes on the CPU
    only; engines keep their own device RNG state in their checkpoints."""
    import random

    import numpy as np

    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: Mapping[str, Any]) -> None:
    import random

    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])

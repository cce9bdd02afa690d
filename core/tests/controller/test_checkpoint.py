"""Checkpoint files: atomic writes, the ``latest`` pointer, finding checkpoints, RNG round trips."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from rlcore.controller.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_state,
    resolve_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


def writer(text: str):
    def save(path: str) -> None:
        from pathlib import Path

        Path(path).mkdir(parents=True)
        (Path(path) / "weights.txt").write_text(text)

    return save


def test_save_writes_roles_state_config_and_the_pointer_last(tmp_path):
    path = save_checkpoint(tmp_path, 3, {"actor": writer("a3")}, {"step": 3, "x": [1, 2]}, "engine: fake\n")
    assert path == tmp_path / "checkpoints" / "step_3"
    assert (path / "actor" / "weights.txt").read_text() == "a3"
    assert (path / "config.yaml").read_text() == "engine: fake\n"
    assert load_state(path) == {"step": 3, "x": [1, 2]}
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step_3"
    assert latest_checkpoint(tmp_path) == path
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_3"]


def test_a_save_that_fails_midway_leaves_the_previous_checkpoint_latest(tmp_path):
    good = save_checkpoint(tmp_path, 2, {"actor": writer("a2")}, {"step": 2}, "")

    def crash(path: str) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 4, {"actor": writer("a4"), "critic": crash}, {"step": 4}, "")
    assert not (tmp_path / "checkpoints" / "step_4").exists()
    assert (tmp_path / "checkpoints" / "step_4.tmp").exists()  # what a killed save leaves behind
    assert latest_checkpoint(tmp_path) == good
    # Saving that step again replaces the leftovers.
    again = save_checkpoint(tmp_path, 4, {"actor": writer("a4")}, {"step": 4}, "")
    assert latest_checkpoint(tmp_path) == again and not (tmp_path / "checkpoints" / "step_4.tmp").exists()


def test_saving_a_step_again_replaces_it_whole(tmp_path):
    save_checkpoint(tmp_path, 2, {"actor": writer("old"), "critic": writer("old")}, {"step": 2}, "")
    path = save_checkpoint(tmp_path, 2, {"actor": writer("new")}, {"step": 2}, "")
    assert (path / "actor" / "weights.txt").read_text() == "new"
    assert not (path / "critic").exists()


def test_latest_falls_back_to_the_highest_complete_step(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    save_checkpoint(tmp_path, 2, {}, {"step": 2}, "")
    save_checkpoint(tmp_path, 10, {}, {"step": 10}, "")
    root = tmp_path / "checkpoints"
    (root / "latest").write_text("step_99\n")  # names a folder that is gone
    (root / "step_12").mkdir()  # incomplete: no trainer state
    (root / "step_11.tmp").mkdir()
    assert latest_checkpoint(tmp_path) == root / "step_10"  # numeric order, not "step_2" > "step_10"
    (root / "latest").unlink()
    assert latest_checkpoint(tmp_path) == root / "step_10"


def test_resolve_accepts_a_step_folder_the_checkpoints_folder_or_the_run(tmp_path):
    path = save_checkpoint(tmp_path, 1, {}, {"step": 1}, "")
    assert resolve_checkpoint(path) == path
    assert resolve_checkpoint(tmp_path / "checkpoints") == path
    assert resolve_checkpoint(tmp_path) == path
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        resolve_checkpoint(tmp_path / "elsewhere")
    with pytest.raises(CheckpointError, match="incomplete"):
        load_state(tmp_path)


def test_rng_state_round_trip():
    state = rng_state()
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first

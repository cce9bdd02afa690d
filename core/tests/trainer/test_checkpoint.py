"""Checkpoint files: atomic writes, the ``latest`` pointer, finding checkpoints, RNG round trips, and a
trainer state that is read as data only (a planted pickle is refused, never run)."""

from __future__ import annotations

import json
import math
import pickle
import random

import numpy as np
import pytest
import torch
from rlcore.trainer.checkpoint import (
    LEGACY_STATE_FILE,
    STATE_FILE,
    TENSORS_FILE,
    CheckpointError,
    CheckpointFormatError,
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


def test_trainer_state_round_trip_restores_step_rng_data_position_and_metrics(tmp_path):
    random.gauss(0, 1)  # leaves a cached Gaussian in both generators: their state holds a float too
    np.random.randn()
    loader = {"version": 1, "epoch": 2, "batches_taken": 5, "num_prompts": 40, "shuffle": True, "seed": 7}
    history = [{"step": 0, "val/reward": 0.25}, {"step": 1, "reward/std": math.nan, "lr": 1e-6 / 3}]
    state = {"step": 7, "train_loader": loader, "rng": rng_state(), "kl_coef": 0.05, "history": history}
    path = save_checkpoint(tmp_path, 7, {}, state, "")
    after_save = (random.gauss(0, 1), random.random(), np.random.randn(), np.random.rand(), torch.rand(3))

    random.seed(1), np.random.seed(1), torch.manual_seed(1)  # a fresh process's generators
    loaded = load_state(path)
    set_rng_state(loaded["rng"])
    after_load = (random.gauss(0, 1), random.random(), np.random.randn(), np.random.rand(), torch.rand(3))

    assert after_load[:4] == after_save[:4] and torch.equal(after_load[4], after_save[4])
    assert loaded["step"] == 7 and loaded["kl_coef"] == 0.05 and loaded["train_loader"] == loader
    assert loaded["history"][0] == history[0] and loaded["history"][1]["lr"] == 1e-6 / 3
    assert math.isnan(loaded["history"][1]["reward/std"])
    # Nothing in the checkpoint is a pickle: JSON, and RNG words as uint8 tensors in safetensors.
    assert json.loads((path / STATE_FILE).read_text())["state"]["step"] == 7
    assert loaded["rng"]["torch"].dtype == torch.uint8 and loaded["rng"]["numpy"]["keys"].dtype == torch.uint8
    assert not (path / LEGACY_STATE_FILE).exists()


def test_state_json_cannot_hold_exactly_is_refused_when_saving(tmp_path):
    with pytest.raises(TypeError, match=r"trainer state history\[0\]: a tuple cannot be saved"):
        save_checkpoint(tmp_path, 1, {}, {"history": [(1, 2)]}, "")
    with pytest.raises(TypeError, match="key 3 cannot be saved"):
        save_checkpoint(tmp_path, 1, {}, {"by_step": {3: 1.0}}, "")
    assert latest_checkpoint(tmp_path) is None


class _Planted:
    """Unpickling this creates ``marker``: a stand-in for a payload that runs arbitrary code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_the_planted_payload_would_run_if_unpickled(tmp_path):
    # Shows the refusal tests below are meaningful: this payload does run when unpickled.
    pickle.loads(pickle.dumps(_Planted(tmp_path / "ran"))).close()
    assert (tmp_path / "ran").exists()


@pytest.mark.parametrize("planted", [STATE_FILE, TENSORS_FILE, LEGACY_STATE_FILE])
def test_resume_refuses_a_planted_pickle_and_never_runs_it(tmp_path, planted):
    marker = tmp_path / "pwned"
    path = save_checkpoint(tmp_path / "run", 3, {}, {"step": 3, "rng": rng_state()}, "")
    if planted == LEGACY_STATE_FILE:  # a checkpoint in the old format: only the pickled state
        (path / STATE_FILE).unlink()
        (path / TENSORS_FILE).unlink()
        torch.save({"step": 3, "rng": _Planted(marker)}, path / planted)
    else:
        (path / planted).write_bytes(pickle.dumps(_Planted(marker)))

    # Resume finds the checkpoint (it does not silently start over) and refuses to read it.
    assert resolve_checkpoint(tmp_path / "run") == path
    with pytest.raises(CheckpointFormatError) as refused:
        load_state(path)
    message = str(refused.value)
    assert str(path / planted) in message
    assert "trainer.resume=disable" in message
    assert not marker.exists()


def test_a_state_file_of_other_json_is_refused(tmp_path):
    path = save_checkpoint(tmp_path, 1, {}, {"step": 1}, "")
    (path / STATE_FILE).write_text(json.dumps({"step": 1}))
    with pytest.raises(CheckpointFormatError, match="not an rlcore.trainer_state document"):
        load_state(path)

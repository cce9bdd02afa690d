"""``export_checkpoint``: a run's actor checkpoint becomes a model folder holding the trained weights."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from rlcore.trainer.checkpoint import CheckpointError
from rlcore.trainer.export import export_checkpoint
from rlcore.trainer.run import run_training
from safetensors.torch import load_file

_spec = importlib.util.spec_from_file_location("trainer_task", Path(__file__).with_name("trainer_task.py"))
task = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(task)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_model_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("export")
    files = task.write_task(root / "task")
    config = task.task_config(
        root,
        files,
        model__path=tiny_model_path,
        trainer__total_steps=2,
        trainer__save_freq=1,
        trainer__val_before_train="false",
    )
    result = run_training(config)
    torch.set_num_threads(threads)
    assert result.ok, result.error
    return result


@pytest.mark.parametrize("where", ["run_dir", "checkpoints", "step_2"])
def test_export_writes_the_checkpointed_actor_weights(finished_run, tmp_path, tiny_model_path, where):
    run_dir = finished_run.run_dir
    source = {
        "run_dir": run_dir,
        "checkpoints": run_dir / "checkpoints",
        "step_2": run_dir / "checkpoints" / "step_2",
    }[where]
    out = export_checkpoint(source, tmp_path / "hf")
    assert (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file()
    exported = load_file(out / "model.safetensors")
    # The independent record of the trained weights: what the engine wrote into the latest checkpoint.
    saved = torch.load(run_dir / "checkpoints" / "step_2" / "actor" / "fake_engine.pt", weights_only=True)[
        "model"
    ]
    assert exported.keys() == saved.keys()
    for name in saved:
        assert torch.equal(exported[name], saved[name]), name
    # ... and they are trained: not the weights the run started from.
    first = torch.load(run_dir / "checkpoints" / "step_1" / "actor" / "fake_engine.pt", weights_only=True)[
        "model"
    ]
    assert any(not torch.equal(first[n], saved[n]) for n in saved)


def test_export_names_what_is_missing(finished_run, tmp_path):
    with pytest.raises(CheckpointError, match="no 'critic' role"):
        export_checkpoint(finished_run.run_dir, tmp_path / "hf", role="critic")
    with pytest.raises(ValueError, match="not checkpointed"):
        export_checkpoint(finished_run.run_dir, tmp_path / "hf", role="reference")
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        export_checkpoint(tmp_path, tmp_path / "hf")

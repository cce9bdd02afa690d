"""The ``reward_model:`` section: its start-up checks (before any engine starts), the role's spec and
placement, and ``rlcore train`` refusing a bad section before it makes a run directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rlcore.cluster.placement import role_sizes_from_config
from rlcore.config import load_config
from rlcore.rewards.model_config import (
    RewardModelConfig,
    absolute_paths,
    num_labels,
    reward_model_problems,
    reward_model_spec,
)
from rlcore.testing.tiny_reward import build_tiny_reward_model
from rlcore.trainer.preflight import check_run

RLCORE = Path(sys.executable).with_name("rlcore")


@pytest.fixture(scope="module")
def rm_path(tmp_path_factory):
    return build_tiny_reward_model(tmp_path_factory.mktemp("rm") / "rm")


def rm_config(*overrides: str):
    return load_config(None, ["reward_model.enabled=true", *overrides])


def test_a_good_reward_model_passes_and_makes_a_frozen_score_spec(rm_path):
    config = rm_config(f"reward_model.model_path={rm_path}", "reward_model.micro_batch_size=3")
    assert reward_model_problems(config) == []
    check_run(config)
    spec = reward_model_spec(config)
    assert (spec.head, spec.trainable, spec.micro_batch_size, spec.dtype) == ("score", False, 3, "float32")
    assert spec.model_path == str(rm_path)


def test_off_by_default_and_unchecked_when_off():
    config = load_config(None, ["reward_model.model_path=/nowhere"])
    assert config.reward_model.enabled is False
    assert reward_model_problems(config) == []


def test_missing_path_names_the_key_and_what_to_do():
    (problem,) = reward_model_problems(rm_config())
    assert problem.startswith("'reward_model.model_path': required when reward_model.enabled=true")
    assert "num_labels=1" in problem


def test_a_folder_that_does_not_exist(tmp_path):
    (problem,) = reward_model_problems(rm_config(f"reward_model.model_path={tmp_path / 'nope'}"))
    assert problem.startswith("'reward_model.model_path':") and "does not exist" in problem


def test_a_causal_lm_is_not_a_reward_model(tiny_model_path):
    (problem,) = reward_model_problems(rm_config(f"reward_model.model_path={tiny_model_path}"))
    assert "'reward_model.model_path'" in problem
    assert "Qwen2ForCausalLM, not a ...ForSequenceClassification" in problem
    assert "random weights" in problem


def test_a_classifier_with_two_labels_is_refused(tmp_path):
    path = build_tiny_reward_model(tmp_path / "cls2", num_labels=2, num_layers=1, hidden_size=32)
    (problem,) = reward_model_problems(rm_config(f"reward_model.model_path={path}"))
    assert "has num_labels=2" in problem and "num_labels=1" in problem


def test_num_labels_reads_what_save_pretrained_writes():
    assert num_labels({"id2label": {"0": "LABEL_0"}}) == 1
    assert num_labels({"num_labels": 3}) == 3
    assert num_labels({}) == 2  # transformers' default


def test_an_engine_without_the_score_head_is_named_with_the_key_to_change(rm_path, monkeypatch):
    from rlcore.testing.fakes import FakeTrainEngine

    monkeypatch.setattr(FakeTrainEngine, "heads", ("lm", "value"))
    config = rm_config(f"reward_model.model_path={rm_path}", "reward_model.engine=fake")
    (problem,) = reward_model_problems(config)
    assert problem.startswith("'reward_model.engine': train engine 'fake' (plugin ")
    assert "has no 'score' head" in problem and "set reward_model.engine to an engine that has one" in problem
    assert "fsdp" in problem  # an installed engine that has the head


def test_unknown_engine_name_fails_at_load(rm_path):
    from rlcore.config import ConfigError

    with pytest.raises(ConfigError, match="'reward_model.engine': unknown train engine 'fsdx'"):
        rm_config(f"reward_model.model_path={rm_path}", "reward_model.engine=fsdx")


@pytest.mark.parametrize("bad", ["reward_model.combine=sum", "reward_model.world_size=0"])
def test_bad_values_fail_at_load(bad):
    from rlcore.config import ConfigError

    with pytest.raises(ConfigError, match=bad.split("=")[0].replace(".", r"\.")):
        load_config(None, [bad])


def test_placement_sizes_the_role_by_its_world_size():
    config = load_config(None, ["reward_model.world_size=2", "actor.world_size=4"])
    assert role_sizes_from_config(config, ["actor", "reward_model"]) == {"actor": 4, "reward_model": 2}


def test_relative_paths_become_absolute(rm_path, monkeypatch):
    monkeypatch.chdir(rm_path.parent)
    rm = absolute_paths(RewardModelConfig(enabled=True, model_path=rm_path.name, tokenizer_path="missing"))
    assert rm.model_path == str(rm_path) and rm.tokenizer_path == "missing"


@pytest.mark.parametrize(
    "override, expected",
    [
        ("reward_model.enabled=true", "'reward_model.model_path': required when reward_model.enabled=true"),
        ("reward_model.model_path={causal}", "Qwen2ForCausalLM, not a ...ForSequenceClassification"),
    ],
)
def test_rlcore_train_refuses_a_bad_section_before_making_a_run_directory(
    tmp_path, tiny_model_path, override, expected
):
    runs = tmp_path / "runs"
    args = [
        f"trainer.output_dir={runs}",
        "reward_model.enabled=true",
        override.format(causal=tiny_model_path),
    ]
    result = subprocess.run([str(RLCORE), "train", *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert not runs.exists()


def test_saved_tiny_reward_model_is_a_one_label_sequence_classifier(rm_path):
    saved = json.loads((rm_path / "config.json").read_text())
    assert saved["architectures"] == ["Qwen2ForSequenceClassification"] and num_labels(saved) == 1


@pytest.mark.slow
def test_rlcore_train_runs_rule_and_model_rewards_together(tmp_path, tiny_model_path, rm_path):
    """The CLI path: the fake policy engines in this process, the reward model on the FSDP engine
    (``reward_model.engine`` differs from ``engine``), its score added to the rule reward."""
    import importlib.util

    from rlcore.telemetry.loggers import read_metrics

    spec = importlib.util.spec_from_file_location(
        "trainer_task", Path(__file__).parents[1] / "trainer" / "trainer_task.py"
    )
    task = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(task)
    files = task.write_task(tmp_path / "task")
    args = task.task_overrides(
        tmp_path,
        files,
        "grpo",
        model__path=tiny_model_path,
        trainer__total_steps=2,
        trainer__val_freq=2,
        reward_model__enabled="true",
        reward_model__model_path=rm_path,
        reward_model__engine="fsdp",
        reward_model__combine="add",
    )
    result = subprocess.run([str(RLCORE), "train", *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = read_metrics(tmp_path / "runs" / "run" / "metrics.jsonl")
    steps = [r for r in records if r["step"] > 0]
    assert len(steps) == 2
    for r in steps:
        # Both providers scored: the rule's error count and the model's scores are in every step.
        assert r["reward/errors"] == 0.0 and r["reward_model/retokenized"] == 0.0
        assert r["reward_model/score_std"] > 0
        assert r["reward/mean"] == pytest.approx(
            r["reward_model/score_mean"] + r["reward_model/rule_score_mean"], abs=1e-5
        )
    assert "val/reward" in records[0] and "val/reward" in steps[-1]


@pytest.mark.slow
def test_grpo_raises_the_reward_models_score(tmp_path, tiny_model_path, rm_path):
    """The reward model's score is what GRPO optimises: the fake policy (in this process) learns to write
    what the tiny reward model, on the FSDP engine, scores higher."""
    import importlib.util

    from rlcore.trainer.run import run_training

    spec = importlib.util.spec_from_file_location(
        "trainer_task", Path(__file__).parents[1] / "trainer" / "trainer_task.py"
    )
    task = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(task)
    files = task.write_task(tmp_path / "task")
    config = task.task_config(
        tmp_path,
        files,
        "grpo",
        model__path=tiny_model_path,
        trainer__total_steps=12,
        trainer__val_freq=12,
        trainer__loggers="[jsonl]",
        actor__optim__lr=0.1,
        reward_model__enabled="true",
        reward_model__model_path=rm_path,
        reward_model__engine="fsdp",
    )
    result = run_training(config)
    assert result.ok, result.error
    rewards = [r["reward/mean"] for r in result.history if r["step"] > 0]
    assert all(
        r["reward/mean"] == pytest.approx(r["reward_model/score_mean"], abs=1e-5)
        for r in result.history
        if r["step"] > 0
    )  # combine=replace: the model's score is the whole reward
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.5, rewards
    assert result.val_reward_end > result.val_reward_start + 0.5

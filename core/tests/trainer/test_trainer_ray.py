"""The trainer on a real local Ray instance: engines in Ray actors, weights through the Ray object store.
GRPO and PPO learn there, and match the in-process backend step for step (same seeds)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
from rlcore.cluster import start_ray, stop_ray
from rlcore.trainer.run import run_training

_spec = importlib.util.spec_from_file_location("trainer_task", Path(__file__).with_name("trainer_task.py"))
task = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(task)

SETTINGS = {
    "grpo": {"actor__optim__lr": 0.03},
    "ppo": {"actor__optim__lr": 0.03, "critic__optim__lr": 0.005, "critic__ppo_epochs": 2},
}


@pytest.fixture(scope="module")
def ray_cluster():
    info = start_ray(num_cpus=2)
    yield info
    stop_ray()


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run(tmp_path: Path, tiny_model_path: Path, algorithm: str, backend: str, **extra):
    files = task.write_task(tmp_path / "task")
    config = task.task_config(
        tmp_path,
        files,
        algorithm,
        model__path=tiny_model_path,
        trainer__backend=backend,
        trainer__experiment_name=f"{algorithm}-{backend}",
        trainer__total_steps=12,
        trainer__val_freq=12,
        transport__check_interval=1,  # the post-sync check after every sync, as asserted below
        **{**SETTINGS[algorithm], **extra},
    )
    result = run_training(config)
    assert result.ok, result.error
    return result


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_reward_rises_on_ray_and_matches_the_local_backend(tmp_path, tiny_model_path, ray_cluster, algorithm):
    on_ray = run(tmp_path, tiny_model_path, algorithm, "ray")
    rewards = [r["reward/mean"] for r in on_ray.history if r["step"] > 0]
    assert len(rewards) == 12
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.1
    assert on_ray.val_reward_end > on_ray.val_reward_start
    # Weights crossed processes through the Ray object store, and arrived intact.
    assert all(
        r["sync/bytes"] > 0 and r["sync/logprob_diff_mean"] < 1e-4 for r in on_ray.history if r["step"]
    )

    local = run(tmp_path, tiny_model_path, algorithm, "local")
    for ray_record, local_record in zip(on_ray.history, local.history, strict=True):
        for key in ("reward/mean", "advantages/max", "actor/pg_loss", "actor/grad_norm", "val/reward"):
            if key in local_record:
                assert math.isclose(ray_record[key], local_record[key], rel_tol=1e-4, abs_tol=1e-6), key


def test_hybrid_placement_trains_like_the_local_backend(tmp_path, tiny_model_path, ray_cluster):
    # The rollout replica is built inside the actor's Ray actor and loads its weights there.
    hybrid = run(tmp_path, tiny_model_path, "grpo", "ray", trainer__placement="hybrid")
    assert all(
        r["sync/bytes"] > 0 and r["sync/logprob_diff_mean"] < 1e-4 for r in hybrid.history if r["step"]
    )
    assert hybrid.val_reward_end > hybrid.val_reward_start
    local = run(tmp_path / "local", tiny_model_path, "grpo", "local")
    for hybrid_record, local_record in zip(hybrid.history, local.history, strict=True):
        for key in ("reward/mean", "actor/pg_loss", "actor/grad_norm", "val/reward"):
            if key in local_record:
                assert math.isclose(hybrid_record[key], local_record[key], rel_tol=1e-4, abs_tol=1e-6), key

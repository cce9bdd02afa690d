"""Algorithm flows on the local backend with the fake engines: every preset runs, GRPO and PPO learn the
task, DAPO's dynamic sampling drops constant-reward groups and refills, ReMax scores greedy baselines, an
on-policy update skips the old-log-prob pass, and GRPO without KL builds no reference."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from rlcore.algorithms import ActorLoss
from rlcore.algorithms.presets import PRESETS
from rlcore.api import Batch
from rlcore.config.schema import ActorConfig, RLConfig, RolloutConfig
from rlcore.flows.phases import needs_old_log_probs, update_actor
from rlcore.trainer.loop import Trainer
from rlcore.trainer.run import prepare_run

_spec = importlib.util.spec_from_file_location(
    "trainer_task", Path(__file__).parents[1] / "trainer" / "trainer_task.py"
)
task = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(task)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    # The fakes run tiny ops, where thread hand-offs cost more than the maths on a busy 2-core machine.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_trainer(tmp_path: Path, tiny_model_path: Path, algorithm: str, files=None, **extra) -> Trainer:
    files = files or task.write_task(tmp_path)
    config = task.task_config(tmp_path, files, algorithm, model__path=tiny_model_path, **extra)
    config, run_dir, text = prepare_run(config)
    return Trainer(config, run_dir, config_yaml=text)


def train(tmp_path, tiny_model_path, algorithm, **extra) -> list[dict]:
    trainer = make_trainer(tmp_path, tiny_model_path, algorithm, **extra)
    try:
        return trainer.fit()
    finally:
        trainer.close()


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


@pytest.mark.parametrize(
    ("algorithm", "extra"),
    [
        ("grpo", {"actor__optim__lr": 0.03}),
        # PPO learns slower: its critic starts from a random value head and must not overshoot.
        ("ppo", {"actor__optim__lr": 0.03, "critic__optim__lr": 0.005, "critic__ppo_epochs": 2}),
    ],
)
def test_reward_rises_on_the_local_backend(tmp_path, tiny_model_path, algorithm, extra):
    history = train(
        tmp_path, tiny_model_path, algorithm, trainer__total_steps=12, trainer__val_freq=12, **extra
    )
    rewards = [r["reward/mean"] for r in history if r["step"] > 0]
    assert len(rewards) == 12
    assert mean(rewards[-3:]) > mean(rewards[:3]) + 0.1
    vals = [r["val/reward"] for r in history if "val/reward" in r]
    assert [r["step"] for r in history if "val/reward" in r] == [0, 12]
    assert vals[-1] > vals[0]


@pytest.mark.parametrize("algorithm", sorted(PRESETS))
def test_every_preset_runs_two_steps(tmp_path, tiny_model_path, algorithm):
    # On-policy distillation needs a teacher: the student's own folder (tests/test_e2e_opd.py distils
    # from a trained one).
    extra = {"teacher__model_path": tiny_model_path} if algorithm == "opd" else {}
    trainer = make_trainer(tmp_path, tiny_model_path, algorithm, trainer__total_steps=2, **extra)
    try:
        history = trainer.fit()
        preset = trainer.preset
        # The roles the preset and the algorithm's flow ask for, and no others.
        assert sorted(trainer.roles) == sorted({"actor", *preset.roles, *trainer.algorithm.roles})
    finally:
        trainer.close()
    steps = [r for r in history if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]
    for record in steps:
        for key in (
            "reward/mean",
            "advantages/mean",
            "response_length/mean",
            "actor/pg_loss",
            "actor/grad_norm",
            "actor/entropy",
            "timing/generate",
            "timing/update_actor",
            "timing/sync_weights",
            "perf/tokens_per_s",
        ):
            assert key in record, f"{algorithm} step {record['step']} lacks {key}"
        # The post-sync check runs after the first two syncs (transport.check_interval later on).
        assert ("sync/logprob_diff_mean" in record) == (record["step"] <= 1)
        # Right after a sync the rollout samples from the actor's weights: their log-probs agree.
        assert record["rollout/logprob_diff_mean"] < 1e-4
    if preset.use_kl_loss:
        assert "actor/kl_loss" in steps[-1]
    if preset.use_kl_in_reward:
        assert "actor/reward_kl_penalty" in steps[-1] and "reward/final/mean" in steps[-1]
    if preset.needs_critic:
        assert {"critic/vf_loss", "values/mean", "returns/mean", "timing/update_critic"} <= set(steps[-1])
    if preset.needs_reward_baseline:
        assert "reward/greedy_baseline_mean" in steps[-1] and "timing/generate_baseline" in steps[-1]


def spy_on_actor_updates(trainer: Trainer) -> list:
    """Record every batch the actor is trained on (wrapping the role's train method)."""
    seen = []
    actor = trainer.roles["actor"]
    original = actor.train

    def train(batch, loss_fn, **kwargs):
        seen.append(batch)
        return original(batch, loss_fn, **kwargs)

    actor.train = train
    return seen


def test_dapo_drops_constant_reward_groups_and_refills(tmp_path, tiny_model_path):
    # Every other prompt scores 0.5 whatever the response: its group has equal rewards and must go.
    rows = [task.row(i, ground_truth="const" if i % 2 else "digits") for i in range(32)]
    for i, row in enumerate(rows):  # generation batches of different prompt widths get merged
        row["prompt"][0]["content"] += " and more" * (i // 4)
    files = task.write_task(tmp_path, train_rows=rows)
    trainer = make_trainer(
        tmp_path, tiny_model_path, "dapo", files=files, trainer__total_steps=2, data__shuffle=False
    )
    trained = spy_on_actor_updates(trainer)
    try:
        history = trainer.fit()
    finally:
        trainer.close()
    for record, batch in zip([r for r in history if r["step"] > 0], trained, strict=True):
        # 4 prompts per batch, 2 of them constant: at least two generation batches fill a training batch.
        assert record["dynamic_sampling/num_gen_batches"] >= 2
        assert record["dynamic_sampling/refills"] == record["dynamic_sampling/num_gen_batches"] - 1
        assert record["dynamic_sampling/kept_group_fraction"] <= 0.5
        # Merged rows keep the layout engines rely on: every response starts right after column P.
        width = batch["prompts"].shape[1]
        assert torch.equal(batch["input_ids"][:, width:], batch["responses"])
        assert torch.equal(batch["attention_mask"][:, width:], batch["response_mask"])
        assert record["rollout/logprob_diff_mean"] < 1e-4
        uids = batch["uid"]
        assert len(set(uids)) == 4 and len(batch) == 4 * 4  # train_batch_size groups of rollout.n
        assert all(gt == "digits" for gt in batch["ground_truth"])
        for uid in set(uids):
            rows_of_group = [i for i, u in enumerate(uids) if u == uid]
            scores = batch["token_level_scores"][rows_of_group].sum(-1)
            assert scores.max() > scores.min()
    # Refills drew their prompts from the loader.
    drawn = sum(r["dynamic_sampling/num_gen_batches"] for r in history if r["step"] > 0)
    assert trainer.train_loader.state_dict()["batches_taken"] == drawn


def test_remax_baseline_is_the_greedy_score_of_each_prompt(tmp_path, tiny_model_path):
    trainer = make_trainer(
        tmp_path, tiny_model_path, "remax", trainer__total_steps=1, trainer__val_before_train=False
    )
    trained = spy_on_actor_updates(trainer)
    try:
        trainer.fit()
    finally:
        trainer.close()
    (batch,) = trained
    n = 4
    baselines = batch["reward_baselines"].view(-1, n)
    assert torch.equal(baselines, baselines[:, :1].expand(-1, n))  # one baseline per prompt
    # ReMax: advantage = return - baseline on every valid token, return = the sequence score here.
    scores = batch["token_level_scores"].double().sum(-1)
    mask = batch["response_mask"].bool()
    expected = (scores - batch["reward_baselines"].double())[:, None].expand_as(mask)
    assert torch.allclose(batch["advantages"].double()[mask], expected[mask], atol=1e-5)


def spy_on_actor_infers(trainer: Trainer) -> list:
    """Record every batch the actor scores with ``infer`` (the old-log-prob pass and the sync probe)."""
    seen = []
    actor = trainer.roles["actor"]
    original = actor.infer

    def infer(batch, outputs=("log_probs",)):
        seen.append(batch)
        return original(batch, outputs)

    actor.infer = infer
    return seen


def test_an_on_policy_update_skips_the_old_log_prob_pass(tmp_path, tiny_model_path):
    # One epoch, no mini-batches: one optimizer step per batch (in two micro-batches of 8 rows).
    trainer = make_trainer(
        tmp_path, tiny_model_path, "grpo", trainer__total_steps=2, trainer__val_before_train=False
    )
    trained, scored = spy_on_actor_updates(trainer), spy_on_actor_infers(trainer)
    try:
        history = trainer.fit()
    finally:
        trainer.close()
    steps = [r for r in history if r["step"] > 0]
    assert len(trained) == 2 and all("old_log_probs" not in batch for batch in trained)
    # The actor scored only the post-sync probes, never a training batch.
    assert scored and not any("token_level_scores" in batch for batch in scored)
    for record in steps:
        assert "timing/old_log_probs" not in record
        # Reported from the update's own forward instead of the pass's.
        assert record["rollout/logprob_diff_mean"] < 1e-4
        assert record["actor/ppo_kl"] == 0.0


@pytest.mark.parametrize(
    "extra",
    [
        {"actor__ppo_epochs": 2},
        {"actor__ppo_mini_batch_size": 2},  # of 4 prompts: two optimizer steps
        {"actor__recompute_old_log_probs": "always"},
    ],
    ids=["two-epochs", "two-mini-batches", "always"],
)
def test_the_old_log_prob_pass_runs_when_the_update_is_not_one_step(tmp_path, tiny_model_path, extra):
    trainer = make_trainer(
        tmp_path, tiny_model_path, "grpo", trainer__total_steps=1, trainer__val_before_train=False, **extra
    )
    trained, scored = spy_on_actor_updates(trainer), spy_on_actor_infers(trainer)
    try:
        (record,) = [r for r in trainer.fit() if r["step"] > 0]
    finally:
        trainer.close()
    (batch,) = trained
    assert "timing/old_log_probs" in record and "old_log_probs" in batch
    assert any("token_level_scores" in b for b in scored)
    assert record["rollout/logprob_diff_mean"] < 1e-4 and "rollout/logprob_diff_max" in record
    # The pass sees the whole batch: the quantiles too (rlcore.algorithms.mismatch).
    assert record["rollout/mismatch_k3_kl"] < 1e-8 and abs(record["rollout/mismatch_ppl_ratio"] - 1) < 1e-4
    assert (
        record["rollout/logprob_diff_p50"]
        <= record["rollout/logprob_diff_p99"]
        <= record["rollout/logprob_diff_max"]
    )


class _Ctx:
    """What ``needs_old_log_probs`` and ``update_actor``'s check read of a step context."""

    def __init__(self, preset: str = "grpo", **actor):
        self.config = RLConfig(actor=ActorConfig(**actor), rollout=RolloutConfig(n=4))
        self.preset = PRESETS[preset]


@pytest.mark.parametrize(
    ("preset", "actor", "needed"),
    [
        ("grpo", {}, False),
        ("gspo", {}, False),
        ("dapo", {}, False),
        ("ppo", {}, False),
        ("grpo", {"ppo_mini_batch_size": 4}, False),  # 4 prompts x 4 responses: the whole batch
        ("grpo", {"ppo_mini_batch_size": 8}, False),
        ("grpo", {"ppo_mini_batch_size": 3}, True),
        ("grpo", {"ppo_epochs": 2}, True),
        ("grpo", {"recompute_old_log_probs": "always"}, True),
        ("rloo", {}, True),  # the KL penalty in the reward reads old log-probs before the update
        ("reinforce_plus_plus", {}, True),
        ("remax", {}, True),
    ],
)
def test_needs_old_log_probs_exactly_when_the_shortcut_is_inexact(preset, actor, needed):
    batch = Batch({"response_mask": torch.ones(16, 3)})
    assert needs_old_log_probs(_Ctx(preset, **actor), batch) is needed


def test_update_actor_refuses_several_steps_without_old_log_probs():
    batch = Batch({"response_mask": torch.ones(16, 3)})
    with pytest.raises(ValueError, match=r"no old_log_probs, but actor.ppo_epochs=2"):
        update_actor(_Ctx(ppo_epochs=2), batch, ActorLoss())


def test_grpo_without_a_kl_term_builds_no_reference(tmp_path, tiny_model_path):
    assert PRESETS["grpo"].roles == ("reference",)  # the preset's KL loss needs one
    trainer = make_trainer(
        tmp_path,
        tiny_model_path,
        "grpo",
        algorithm__use_kl_loss="false",
        trainer__total_steps=1,
        trainer__val_before_train=False,
    )
    try:
        (record,) = [r for r in trainer.fit() if r["step"] > 0]
        assert trainer.preset.roles == () and "reference" not in trainer.roles
        assert trainer.ctx.reference is None
    finally:
        trainer.close()
    assert "timing/ref_log_probs" not in record and "actor/kl_loss" not in record

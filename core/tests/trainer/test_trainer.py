"""The Trainer around the flows: checkpoint/resume equivalence, colocated memory release by phase,
validation per data source, and the resume settings."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
from rlcore.telemetry.loggers import read_metrics
from rlcore.trainer.checkpoint import latest_checkpoint
from rlcore.trainer.loop import Trainer
from rlcore.trainer.run import prepare_run

_spec = importlib.util.spec_from_file_location("trainer_task", Path(__file__).with_name("trainer_task.py"))
task = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(task)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_trainer(root: Path, files: dict, tiny_model_path: Path, algorithm: str = "grpo", **extra) -> Trainer:
    config = task.task_config(root, files, algorithm, model__path=tiny_model_path, **extra)
    config, run_dir, text = prepare_run(config)
    return Trainer(config, run_dir, config_yaml=text)


def comparable(record: dict) -> dict:
    """A step's metrics without wall-clock quantities."""
    return {k: v for k, v in record.items() if not k.startswith(("timing/", "perf/")) and "seconds" not in k}


# PPO with an adaptive in-reward KL and two mini-batches per step: the checkpoint must carry the actor's
# and the critic's optimizer states, the KL coefficient, the data position and the sampling streams.
RESUME_SETTINGS = {
    "trainer__total_steps": 4,
    "trainer__save_freq": 2,
    "algorithm__use_kl_in_reward": "true",
    "algorithm__kl_ctrl__type": "adaptive",
    "algorithm__kl_ctrl__kl_coef": 0.05,
    "algorithm__kl_ctrl__target_kl": 0.01,
    "algorithm__kl_ctrl__horizon": 10,
    "actor__ppo_mini_batch_size": 2,
}


def test_a_resumed_run_reproduces_the_uninterrupted_one(tmp_path, tiny_model_path):
    files = task.write_task(tmp_path / "task")
    straight = make_trainer(
        tmp_path, files, tiny_model_path, "ppo", trainer__experiment_name="straight", **RESUME_SETTINGS
    )
    try:
        expected = straight.fit()
    finally:
        straight.close()

    # The interrupted run checkpoints at step 2, finishes step 3, and dies before saving again.
    killed = make_trainer(
        tmp_path, files, tiny_model_path, "ppo", trainer__experiment_name="killed", **RESUME_SETTINGS
    )
    try:
        killed.fit(num_steps=3)
        assert killed.step == 3
    finally:
        killed.close()
    run_dir = tmp_path / "runs" / "killed"
    assert latest_checkpoint(run_dir).name == "step_2"
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == [0, 1, 2, 3]

    resumed = make_trainer(
        tmp_path, files, tiny_model_path, "ppo", trainer__experiment_name="killed", **RESUME_SETTINGS
    )
    try:
        assert resumed.resumed_from.name == "step_2" and resumed.step == 2
        got = resumed.fit()
    finally:
        resumed.close()

    assert [r["step"] for r in got] == [r["step"] for r in expected] == [0, 1, 2, 3, 4]
    for want, have in zip(expected, got, strict=True):
        want, have = comparable(want), comparable(have)
        assert want.keys() == have.keys()
        for key in want:
            assert math.isclose(have[key], want[key], rel_tol=1e-5, abs_tol=1e-6), (want["step"], key)
    # The KL coefficient adapted, and the resumed run continued from the saved value.
    coefs = [r["actor/reward_kl_penalty_coeff"] for r in got if r["step"] > 0]
    assert coefs[0] == pytest.approx(0.05) and len(set(coefs)) == 4
    # metrics.jsonl lost the killed run's unsaved step 3: every step appears once.
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == [0, 1, 2, 3, 4]
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == ["latest", "step_2", "step_4"]
    assert sorted(p.name for p in (run_dir / "checkpoints" / "step_4").iterdir()) == [
        "actor",
        "config.yaml",
        "critic",
        "trainer_state.json",
        "trainer_state.safetensors",
    ]


def test_resume_disable_starts_afresh(tmp_path, tiny_model_path):
    files = task.write_task(tmp_path / "task")
    first = make_trainer(tmp_path, files, tiny_model_path, trainer__total_steps=1)
    first.fit()
    first.close()
    again = make_trainer(tmp_path, files, tiny_model_path, trainer__total_steps=1, trainer__resume="disable")
    try:
        assert again.resumed_from is None and again.step == 0
    finally:
        again.close()
    explicit = make_trainer(
        tmp_path,
        files,
        tiny_model_path,
        trainer__total_steps=2,
        trainer__resume=str(tmp_path / "runs" / "run" / "checkpoints" / "step_1"),
    )
    try:
        assert explicit.step == 1
    finally:
        explicit.close()


def test_save_freq_minus_one_never_saves(tmp_path, tiny_model_path):
    files = task.write_task(tmp_path / "task")
    trainer = make_trainer(
        tmp_path,
        files,
        tiny_model_path,
        trainer__total_steps=1,
        trainer__save_freq=-1,
        trainer__experiment_name="x",
    )
    try:
        trainer.fit()
    finally:
        trainer.close()
    run_dir = tmp_path / "runs" / "x"
    assert (run_dir / "metrics.jsonl").is_file() and latest_checkpoint(run_dir) is None


def engine(role) -> object:
    """The engine of a local role's only worker."""
    return role.group.workers[0].engine


def spy(trainer: Trainer, seen: list) -> None:
    """Record which tags each engine has released whenever the rollout generates or the actor trains."""
    rollout, actor = trainer.ctx.rollout, trainer.roles["actor"]
    engines = {"rollout": engine(rollout), **{n: engine(r) for n, r in trainer.roles.items()}}

    def snapshot(phase):
        seen.append((phase, {name: set(e.released) for name, e in engines.items()}))

    generate, train = rollout.generate, actor.train

    def spy_generate(*args, **kwargs):
        snapshot("generate")
        return generate(*args, **kwargs)

    def spy_train(*args, **kwargs):
        snapshot("train")
        return train(*args, **kwargs)

    rollout.generate, actor.train = spy_generate, spy_train


def fit_spied(trainer: Trainer) -> tuple[list, list]:
    """Train to the end (then close), recording the released tags at each phase (:func:`spy`)."""
    seen: list = []
    spy(trainer, seen)
    try:
        return trainer.fit(), seen
    finally:
        trainer.close()


def test_colocated_roles_release_memory_around_each_phase(tmp_path, tiny_model_path):
    files = task.write_task(tmp_path / "task")
    trainer = make_trainer(
        tmp_path,
        files,
        tiny_model_path,
        trainer__total_steps=2,
        trainer__release_train_in_rollout="true",
        trainer__val_before_train="false",
        trainer__device="fake",  # a device with memory of its own (the CPU platform releases nothing)
    )
    records, seen = fit_spied(trainer)
    steps = [r for r in records if "timing/step" in r]
    assert len(steps) == 2
    for record in steps:  # the moves' time, a part of the step's
        assert 0 < record["timing/release_resume"] < record["timing/step"]
    generating = [state for phase, state in seen if phase == "generate"]
    training = [state for phase, state in seen if phase == "train"]
    assert generating and training
    for state in generating:  # step generations, validation and post-sync probes
        assert state["rollout"] == set()
        assert state["reference"] == {"weights"}
        assert state["actor"] in ({"weights", "grads", "optimizer"}, {"grads", "optimizer"})
    assert any(state["actor"] == {"weights", "grads", "optimizer"} for state in generating)
    for state in training:
        assert state == {"rollout": {"weights", "kv_cache"}, "actor": set(), "reference": set()}


def test_colocated_roles_on_cpus_release_nothing(tmp_path, tiny_model_path):
    # The device is the host's memory: a release would move nothing, so none is issued.
    files = task.write_task(tmp_path / "task")
    trainer = make_trainer(
        tmp_path, files, tiny_model_path, trainer__total_steps=1, trainer__release_train_in_rollout="true"
    )
    records, seen = fit_spied(trainer)
    assert seen and all(state == {"rollout": set(), "actor": set(), "reference": set()} for _, state in seen)
    assert [r["timing/release_resume"] for r in records if "timing/step" in r] == [0.0]


def test_split_placement_releases_nothing(tmp_path, tiny_model_path):
    files = task.write_task(tmp_path / "task")
    trainer = make_trainer(
        tmp_path,
        files,
        tiny_model_path,
        trainer__total_steps=1,
        trainer__placement="split",
        trainer__release_train_in_rollout="true",
    )
    _, seen = fit_spied(trainer)
    assert seen and all(not tags for _, state in seen for tags in state.values())


def test_validation_reports_the_mean_reward_per_data_source(tmp_path, tiny_model_path):
    files = task.write_task(tmp_path / "task")  # 6 validation prompts from test/digits, 2 from test/other
    trainer = make_trainer(tmp_path, files, tiny_model_path, trainer__total_steps=1, rollout__val_n=2)
    try:
        metrics = trainer.validate()
        again = trainer.validate()
    finally:
        trainer.close()
    digits, other = metrics["val/reward/test/digits"], metrics["val/reward/test/other"]
    assert metrics["val/reward"] == pytest.approx((6 * digits + 2 * other) / 8)
    assert 0 <= other <= 1 and 0 <= digits <= 1
    # Greedy decoding (val_temperature=0) with unchanged weights gives the same answers.
    assert again["val/reward"] == metrics["val/reward"]
    assert metrics["val/response_length/mean"] > 0


def test_an_sft_warm_up_runs_between_the_first_validation_and_rl(tmp_path, tiny_model_path):
    files = task.write_task(tmp_path / "task")
    sft_rows = [{**task.row(i), "response": "12345 678 90"} for i in range(16)]
    sft_file = task.write_jsonl(tmp_path / "task" / "sft.jsonl", sft_rows)
    trainer = make_trainer(
        tmp_path,
        files,
        tiny_model_path,
        trainer__total_steps=1,
        trainer__warmup_sft_steps=15,
        sft__files=f"[{sft_file}]",
        sft__batch_size=8,
        actor__optim__lr=0.01,
    )
    try:
        assert len(trainer.sft_examples) == 16
        history = trainer.fit()
    finally:
        trainer.close()
    first = history[0]
    assert first["step"] == 0 and first["sft/steps"] == 15
    assert first["sft/loss"] < first["sft/loss_first"]
    # The warm-up taught digits, which is what the task rewards; the rollout got the new weights.
    assert first["val/reward_after_sft"] > first["val/reward"] + 0.2
    assert first["sync/logprob_diff_mean"] < 1e-4


def test_rollout_dtype_sets_the_rollout_engine_and_its_weight_stream(tmp_path, tiny_model_path):
    """``rollout.dtype: bfloat16`` under an fp32 trainer: the engine is built in bf16 and the weights
    travel in bf16 (half the bytes); unset, both follow ``model.dtype``."""
    files = task.write_task(tmp_path / "task")
    seen = {}
    for dtype in ("null", "bfloat16"):
        trainer = make_trainer(
            tmp_path,
            files,
            tiny_model_path,
            trainer__total_steps=1,
            trainer__val_before_train="false",
            trainer__experiment_name=f"rollout-{dtype}",
            rollout__dtype=dtype,
        )
        try:
            (engine,) = [w.engine for w in trainer.ctx.rollout.group.workers]
            records = trainer.fit()
        finally:
            trainer.close()
        seen[dtype] = (engine.spec.dtype, records[-1]["sync/bytes"])
    assert seen["null"][0] == "float32" and seen["bfloat16"][0] == "bfloat16"
    assert seen["bfloat16"][1] == seen["null"][1] / 2


def test_profile_step_writes_each_workers_top_operators(tmp_path, tiny_model_path):
    files = task.write_task(tmp_path / "task")
    trainer = make_trainer(
        tmp_path,
        files,
        tiny_model_path,
        trainer__total_steps=2,
        trainer__profile_step=2,
        trainer__val_before_train="false",
    )
    try:
        trainer.fit()
        folder = trainer.run_dir / "profile"
    finally:
        trainer.close()
    assert [p.name for p in folder.iterdir()] == ["step2"]  # that step only
    tables = {p.name: p.read_text() for p in (folder / "step2").iterdir()}
    assert {"actor-0.txt", "rollout-0.txt"} <= set(tables)
    assert all("Self CPU" in text and "aten::" in text for text in tables.values())

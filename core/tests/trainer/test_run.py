"""``run_training`` end to end: run directory, metrics file, curves PNG, summary, built-in model, and
failures that stop the run with one clear message."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

import pytest
import torch
from rich.console import Console
from rlcore.telemetry.loggers import read_metrics
from rlcore.trainer.run import resolve_model_path, run_training

_spec = importlib.util.spec_from_file_location("trainer_task", Path(__file__).with_name("trainer_task.py"))
task = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(task)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run(tmp_path: Path, tiny_model_path: Path, files: dict | None = None, **extra):
    files = files or task.write_task(tmp_path / "task")
    config = task.task_config(tmp_path, files, model__path=tiny_model_path, **extra)
    out = io.StringIO()
    result = run_training(config, console=Console(file=out, width=200))
    return result, out.getvalue()


def test_a_run_writes_metrics_curves_checkpoint_and_a_summary(tmp_path, tiny_model_path):
    result, printed = run(
        tmp_path,
        tiny_model_path,
        trainer__loggers="[console,jsonl,tensorboard]",
        trainer__total_steps=3,
        transport__check_interval=2,
    )
    assert result.ok and result.error is None and result.steps == 3
    run_dir = tmp_path / "runs" / "run"
    assert result.run_dir == run_dir
    assert (run_dir / "config.yaml").is_file()

    records = read_metrics(result.metrics_path)
    assert result.metrics_path == run_dir / "metrics.jsonl"
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert {"val/reward", "val/reward/test/digits", "val/reward/test/other", "sync/logprob_diff_mean"} <= set(
        records[0]
    )
    expected = {
        "reward/mean",
        "reward/std",
        "advantages/mean",
        "response_length/mean",
        "response_length/clip_ratio",
        "actor/kl_loss",
        "actor/entropy",
        "actor/pg_clipfrac",
        "actor/grad_norm",
        "actor/lr",
        "timing/generate",
        "timing/score",
        "timing/ref_log_probs",
        "timing/advantages",
        "timing/update_actor",
        "timing/sync_weights",
        "timing/step",
        "perf/tokens_per_s",
        "perf/generate_tokens_per_s",
        "sync/bytes",
        "rollout/logprob_diff_mean",
        "rollout/mismatch_k3_kl",  # from the update's forward: this run skips the old-log-prob pass
        "rollout/mismatch_ppl_ratio",
        "reward/errors",
        "train/epoch",
    }
    for record in records[1:]:
        assert expected <= set(record), expected - set(record)
        assert "timing/old_log_probs" not in record  # an on-policy update needs no separate pass
    # The post-sync check: the first two syncs, then every transport.check_interval=2 steps.
    assert [r["step"] for r in records if "sync/logprob_diff_mean" in r] == [0, 1, 2]
    assert {"sync/logprob_diff_p99", "sync/mismatch_k3_kl", "sync/mismatch_ppl_ratio"} <= set(records[0])
    assert "val/reward" in records[2] and "timing/save" in records[3]  # val_freq=2; saved at the end
    assert result.history == records

    assert result.plot_path == run_dir / "curves.png"
    assert result.plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert result.checkpoint == run_dir / "checkpoints" / "step_3"

    assert result.val_reward_start == records[0]["val/reward"]
    assert result.val_reward_end == records[3]["val/reward"]
    assert (
        f"validation reward: {result.val_reward_start:.4f} at the start -> {result.val_reward_end:.4f}"
        in printed
    )
    assert str(result.metrics_path) in printed and str(result.plot_path) in printed
    assert "step 3/3" in printed and "reward" in printed


def test_a_raising_reward_function_stops_the_run_naming_the_sample(tmp_path, tiny_model_path):
    files = task.write_task(
        tmp_path / "task", train_rows=[task.row(i, ground_truth="boom") for i in range(8)]
    )
    result, printed = run(tmp_path, tiny_model_path, files)
    assert not result.ok and result.steps == 0  # step 1 did not complete
    assert "at step 1 in phase 'score'" in result.error
    assert "RewardError" in result.error and "dataset index" in result.error
    assert "ValueError: this scorer cannot score sample" in result.error
    assert "reward.on_error=zero" in result.error  # the message says what to do
    assert result.error in printed.replace("\n", "") or "training stopped at step 1" in printed
    log = tmp_path / "runs" / "run" / "error.log"
    assert "Traceback" in log.read_text() and str(log) in printed
    assert "resume from the last checkpoint" not in printed  # there is none
    # One message (quoting the scorer's own traceback), not the controller's stack.
    assert "trainer/loop.py" not in printed and "trainer/run.py" not in printed


def test_on_error_zero_scores_failing_samples_zero_and_counts_them(tmp_path, tiny_model_path):
    rows = [task.row(i, ground_truth="boom" if i % 2 else "digits") for i in range(8)]
    files = task.write_task(tmp_path / "task", train_rows=rows)
    result, _ = run(
        tmp_path,
        tiny_model_path,
        files,
        reward__on_error="zero",
        trainer__total_steps=2,
        data__shuffle="false",
    )
    assert result.ok, result.error
    # Batches hold prompts 0-3 and 4-7: two failing prompts of four responses each.
    assert [r["reward/errors"] for r in result.history if r["step"] > 0] == [8.0, 8.0]


def test_bad_data_stops_the_run_before_any_engine_starts(tmp_path, tiny_model_path):
    files = task.write_task(tmp_path / "task")
    bad = dict(task.row(0))
    del bad["reward_model"]
    files["train"] = task.write_jsonl(tmp_path / "task" / "bad.jsonl", [bad] * 8)
    result, printed = run(tmp_path, tiny_model_path, files)
    assert not result.ok and result.steps == 0
    assert "during setup" in result.error and "DataError" in result.error and "bad.jsonl" in result.error
    assert "reward_model" in result.error


def test_builtin_tiny_is_built_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCORE_CACHE_DIR", str(tmp_path / "cache"))
    path = Path(resolve_model_path("builtin:tiny"))
    assert path == tmp_path / "cache" / "models" / "tiny"
    assert (path / "config.json").is_file() and (path / "tokenizer_config.json").is_file()
    stamp = (path / "config.json").stat().st_mtime_ns
    assert resolve_model_path("builtin:tiny") == str(path)
    assert (path / "config.json").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="builtin:tiny"):
        resolve_model_path("builtin:huge")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model_path(str(tmp_path / "no-such-model"))


def test_builtin_task_files_are_written_into_the_run(tmp_path, tiny_model_path):
    from rlcore.config import load_config
    from rlcore.trainer.run import prepare_run

    config = load_config(
        None,
        [
            "data.train_files=[builtin:copy_word/train.jsonl]",
            f"model.path={tiny_model_path}",
            f"trainer.output_dir={tmp_path}",
            "trainer.experiment_name=task",
        ],
    )
    config, run_dir, text = prepare_run(config)
    data = run_dir / "data" / "copy_word"
    assert config.data.train_files == [str(data / "train.jsonl")]
    assert config.data.val_files == [str(data / "val.jsonl")]  # from the task's recipe
    assert config.sft.files == [str(data / "sft.jsonl")]
    assert all((data / f"{split}.jsonl").is_file() for split in ("train", "val", "sft"))
    assert str(data / "train.jsonl") in (run_dir / "config.yaml").read_text()


class _DyingTrainer:
    """Stands in for the Trainer: its ``fit`` raises ``errors`` in turn (one per attempt), then finishes;
    every attempt is recorded with the resume setting it was built with."""

    attempts: list[dict] = []
    errors: list[BaseException] = []

    def __init__(self, config, run_dir, *, console=None, config_yaml=""):
        self.config, self.step, self.history, self.resumed_from = config, 0, [], None
        self.last_saved = Path(run_dir) / "checkpoints" / f"step_{len(self.attempts) + 1}"
        self.restarts = 0
        self.attempts.append({"resume": config.trainer.resume})

    def fit(self):
        self.attempts[-1]["restarts"] = self.restarts
        self.step = 2
        if len(self.attempts) <= len(self.errors):
            raise self.errors[len(self.attempts) - 1]
        self.history = [{"step": 3}]

    def close(self):
        self.attempts[-1]["closed"] = True


@pytest.mark.parametrize(
    ("max_restarts", "errors", "ok", "attempts"),
    [
        (1, ["died"], True, 2),  # one death, one restart, from the checkpoint the attempt wrote
        (1, ["died", "died"], False, 2),  # it comes back: the run stops with the report
        (0, ["died"], False, 1),  # no restarts asked for
        (3, ["raised"], False, 1),  # a method that raised never restarts
    ],
)
def test_a_dead_worker_restarts_the_run_up_to_max_restarts(
    tmp_path, tiny_model_path, monkeypatch, capsys, max_restarts, errors, ok, attempts
):
    import rlcore.trainer.loop
    from rlcore.cluster.failures import WorkerError, WorkerFailure

    make = {
        "died": lambda: WorkerFailure("actor", 1, "train_step", "SIGKILL"),
        "raised": lambda: WorkerError("actor", 1, "train_step", "ValueError: bad batch"),
    }
    monkeypatch.setattr(_DyingTrainer, "attempts", [])
    monkeypatch.setattr(_DyingTrainer, "errors", [make[e]() for e in errors])
    monkeypatch.setattr(rlcore.trainer.loop, "Trainer", _DyingTrainer)
    result, out = run(tmp_path, tiny_model_path, trainer__max_restarts=max_restarts)
    assert result.ok is ok
    runs = _DyingTrainer.attempts
    assert len(runs) == attempts and all(r["closed"] for r in runs)
    assert [r["restarts"] for r in runs] == list(range(attempts))
    if attempts > 1:  # resumed from the checkpoint the first attempt wrote, whatever trainer.resume said
        assert runs[1]["resume"].endswith("checkpoints/step_1")
        line = "restart 1/1: actor rank 1 died in train_step at step 2; every worker starts again from checkpoint step_1"
        assert line in out and f"rlcore: {line}" in capsys.readouterr().err
    else:
        assert "restart 1/" not in out and "rlcore: restart" not in capsys.readouterr().err

"""End to end: the rollout stream (``trainer.mode=stream``, docs/async.md) on the built-in task, with the
FSDP engine and the HF rollout on one shared pool (the default layout: the rollout inside the actor).

* with no over-sampling and staleness 0 the stream is the synchronous run, step by step;
* its schedule depends on seeds and token counts only: the same command twice gives the same run;
* a killed driver resumes without training a prompt twice or losing one (counted);
* it learns the task like the synchronous run after the same number of trained samples, as the median
  of three seeds (each run is deterministic: no assertion here depends on timing).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from rlcore.config import load_config
from rlcore.stream import STREAM_FILE, read_stream
from rlcore.telemetry.loggers import read_metrics
from rlcore.telemetry.samples import SAMPLES_FILE, read_samples
from rlcore.trainer.loop import Trainer
from rlcore.trainer.run import prepare_run

pytestmark = pytest.mark.slow

RLCORE = Path(sys.executable).with_name("rlcore")
STEPS = 20  # the shared default run's (tests/conftest.py: DEFAULT_RUN_STEPS)
COMMON = ("trainer.val_freq=0", "trainer.loggers=[jsonl]", "trainer.resume=disable")
#: Rounds of 2 tokens: the task's answers (up to 6 tokens) are cut at a step's end and finish in the next.
CUT = ("trainer.mode=stream", "trainer.rollout_chunk_tokens=2")
COMPARED = ("reward/mean", "response_length/mean", "actor/pg_loss", "actor/entropy", "actor/grad_norm")


def train(out: Path, name: str, *overrides: str, steps: int | None = None) -> Trainer:
    config = load_config(
        overrides=[f"trainer.output_dir={out}", f"trainer.experiment_name={name}", *COMMON, *overrides]
    )
    config, run_dir, text = prepare_run(config)
    trainer = Trainer(config, run_dir, config_yaml=text)
    try:
        trainer.fit(steps)
    finally:
        trainer.close()
    return trainer


def test_the_stream_without_over_sampling_or_staleness_is_the_synchronous_run(default_run, tmp_path):
    steps = 4
    run = train(
        tmp_path,
        "stream0",
        "trainer.mode=stream",
        "trainer.stream.over_sampling=0",
        "trainer.max_staleness=0",
        f"trainer.total_steps={STEPS}",
        steps=steps,
    )
    ours = [r for r in run.history if r["step"] > 0]
    theirs = [r for r in read_metrics(default_run[1] / "metrics.jsonl") if 0 < r["step"] <= steps]
    assert len(ours) == len(theirs) == steps
    for a, b in zip(ours, theirs, strict=True):
        for key in COMPARED:
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (a["step"], key, a[key], b[key])
        assert a["stream/carried_over"] == 0 and a["stream/tokens_lag/0"] == 1.0
    ours_samples = read_samples(run.run_dir / SAMPLES_FILE)
    theirs_samples = read_samples(default_run[1] / SAMPLES_FILE)[:steps]
    assert [line["index"] for line in ours_samples] == [line["index"] for line in theirs_samples]


def _timed(key: str) -> bool:
    """Metrics that measure time (and rates over it): they differ between any two runs."""
    return key.startswith(("timing/", "perf/")) or "seconds" in key or key == "stream/rollout_idle_share"


def _run_facts(run: Trainer) -> tuple[list, list, list]:
    """Every metric but the timed ones, the stream's group lives without their times, the trained samples."""
    records = [{k: v for k, v in r.items() if not _timed(k)} for r in run.history if r["step"] > 0]
    lives = [
        {k: v for k, v in line.items() if not k.endswith("_at")}
        for line in read_stream(run.run_dir / STREAM_FILE)
    ]
    return records, lives, read_samples(run.run_dir / SAMPLES_FILE)


def test_the_same_stream_command_twice_gives_the_same_run(tmp_path):
    runs = [train(tmp_path, f"twice{i}", *CUT, "trainer.total_steps=4") for i in range(2)]
    first, second = (_run_facts(r) for r in runs)
    assert first == second
    records = first[0]
    assert any(r["stream/carried_unfinished"] > 0 for r in records), "no response was cut at a step's end"
    assert any(r.get("off_policy/multi_version_fraction", 0) > 0 for r in records)


def _trained_and_pending(run_dir: Path) -> tuple[list[int], list[int]]:
    """Each trained group's prompt index, and the prompts the last checkpoint's stream had in flight."""
    from rlcore.trainer.checkpoint import latest_checkpoint, load_state

    trained = [i for line in read_samples(run_dir / SAMPLES_FILE) for i in line["index"][::8]]
    return trained, load_state(latest_checkpoint(run_dir))["stream"]["pending"]


def test_a_killed_stream_resumes_without_training_a_prompt_twice_or_losing_one(
    default_run, tmp_path, train_env, kill_after_steps
):
    env = train_env(tmp_path)
    steps = 9
    args = [
        str(RLCORE),
        "train",
        f"trainer.output_dir={tmp_path / 'runs'}",
        "trainer.experiment_name=killed",
        *CUT,
        f"trainer.total_steps={steps}",
        "trainer.save_freq=3",
        "trainer.val_freq=0",
        "trainer.loggers=[jsonl]",
    ]
    run_dir = tmp_path / "runs" / "killed"
    kill_after_steps(args, env, tmp_path, run_dir)  # past the step-3 checkpoint
    saved = int((run_dir / "checkpoints" / "latest").read_text().strip().removeprefix("step_"))
    assert saved >= 3
    done = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "resumed from" in output, output[-4000:]
    assert (run_dir / "stream.png").is_file()  # the requests across steps, drawn by rlcore train
    lines = read_samples(run_dir / SAMPLES_FILE)
    assert [line["step"] for line in lines] == list(range(1, steps + 1))
    trained, pending = _trained_and_pending(run_dir)
    # The stream draws whole loader batches in the loader's order, which is the synchronous run's step
    # order (same seed): what was drawn is trained once or still pending, nothing else.
    drawn = len(trained) + len(pending)
    batch = 32
    assert drawn % batch == 0
    order = [i for line in read_samples(default_run[1] / SAMPLES_FILE) for i in line["index"][::8]]
    assert Counter(trained) + Counter(pending) == Counter(order[:drawn])
    regenerated = [
        r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("stream/regenerated_on_resume")
    ]
    assert regenerated and regenerated[0]["stream/regenerated_on_resume"] > 0


SEEDS = (0, 1, 2)


def test_the_stream_learns_like_the_synchronous_run_over_three_seeds(default_run, tmp_path):
    final = {"sync": [], "stream": []}
    for seed in SEEDS:
        sync = (
            default_run[1]
            if seed == 0
            else train(
                tmp_path, f"sync{seed}", f"trainer.seed={seed}", f"trainer.total_steps={STEPS}"
            ).run_dir
        )
        stream = train(
            tmp_path, f"stream{seed}", *CUT, f"trainer.seed={seed}", f"trainer.total_steps={STEPS}"
        )
        final["sync"].append(read_metrics(sync / "metrics.jsonl")[-1]["val/reward"])
        final["stream"].append(read_metrics(stream.run_dir / "metrics.jsonl")[-1]["val/reward"])
        # The same number of trained samples: STEPS batches of train_batch_size groups.
        assert len(read_samples(stream.run_dir / SAMPLES_FILE)) == STEPS
    ours, theirs = statistics.median(final["stream"]), statistics.median(final["sync"])
    print("final validation rewards", final)
    assert ours >= theirs - 0.1, final

"""End to end: worker processes that die mid-run (the CPU versions of issue 35's fault cases), on the
embedded local Ray with the FSDP engine and the HF rollout in a process of its own (``colocated``).

One ``rlcore train`` run in which first a rollout replica's process and then, after the restart, a train
rank's process end themselves (``os._exit``, as a kill would: ``rlcore.testing.faults``): the run restarts
every worker from its last checkpoint each time (``trainer.max_restarts``), finishes, says so in its log
and metrics, and trains each step's prompts once: the same prompts in the same order as the uninterrupted
default run, counted from ``trained_samples.jsonl``.
"""

from __future__ import annotations

import pytest
from rlcore.telemetry.loggers import read_metrics
from rlcore.telemetry.samples import SAMPLES_FILE, read_samples
from rlcore.testing.faults import DIE_ENV

pytestmark = pytest.mark.slow

STEPS = 4
COMMON = (
    "trainer.placement=colocated",  # the rollout replica in a process of its own, to be killed alone
    "rollout.engine=hf",
    f"trainer.total_steps={STEPS}",
    "trainer.save_freq=1",
    "trainer.warmup_sft_steps=0",
    "trainer.val_before_train=false",
    "trainer.val_freq=0",
    "data.val_files=[]",
    "trainer.loggers=[jsonl]",
)


def test_dead_workers_restart_from_the_last_checkpoint_and_train_each_prompt_once(
    default_run, rlcore_train, tmp_path, monkeypatch
):
    # Rollout replica 0 dies at its third generate call (the post-sync probes generate too: in step 1,
    # before its checkpoint); then, in the restarted processes, actor rank 0 at its second update (step 2,
    # after step 1's checkpoint).
    cues = [
        f"rollout:0:generate:3:{tmp_path / 'rollout-died'}",
        f"actor:0:train_step:2:{tmp_path / 'actor-died'}",
    ]
    monkeypatch.setenv(DIE_ENV, ",".join(cues))
    output, run_dir = rlcore_train(tmp_path, "restarted", *COMMON, "trainer.max_restarts=2")
    assert (tmp_path / "rollout-died").is_file() and (tmp_path / "actor-died").is_file()
    driver = (run_dir / "logs" / "driver.log").read_text()
    restarts = [line for line in driver.splitlines() if line.startswith("rlcore: restart ")]
    assert len(restarts) == 2, driver[-3000:]
    assert restarts[0].startswith("rlcore: restart 1/2: rollout rank 0 died in generate at step ")
    assert restarts[1].startswith("rlcore: restart 2/2: actor rank 0 died in train_step at step ")
    assert all("every worker starts again from " in line for line in restarts), restarts
    assert restarts[1].startswith(
        "rlcore: restart 2/2: actor rank 0 died in train_step at step 2; every worker "
        "starts again from checkpoint step_1"
    ), restarts
    assert "restart 2/2" in output
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in r]
    assert records[-1]["step"] == STEPS and records[-1]["faults/restarts"] == 2
    # Each step trained once, on the prompts the uninterrupted default run trained at that step.
    lines = read_samples(run_dir / SAMPLES_FILE)
    assert [line["step"] for line in lines] == list(range(1, STEPS + 1))
    reference = read_samples(default_run[1] / SAMPLES_FILE)[:STEPS]
    assert [sorted(set(line["index"])) for line in lines] == [sorted(set(r["index"])) for r in reference]
    assert [len(line["index"]) for line in lines] == [len(r["index"]) for r in reference]

"""The run's ``sandbox:`` section reaches the reward worker processes: the trainer exports it before
any worker starts, and a scorer there builds its sandbox from it.

Reward workers are forked from multiprocessing's forkserver, which keeps the environment it started
with (the first pool of the process); the pool's initializer hands them the driver's current
``RLCORE_*`` variables, so this passes whether or not an earlier test started the forkserver."""

from __future__ import annotations

import importlib.util
import io
import json
import os
from pathlib import Path

from rich.console import Console
from rlcore.sandbox import SANDBOX_ENV
from rlcore.trainer.run import run_training

_spec = importlib.util.spec_from_file_location(
    "trainer_task", Path(__file__).parents[1] / "trainer" / "trainer_task.py"
)
task = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(task)

RECORDING_REWARD = """
import json, os
from rlcore.sandbox import default_sandbox, default_sandbox_config

def compute_score(data_source, solution_str, ground_truth, extra_info=None, out=None):
    config = default_sandbox_config()
    with open(out, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "name": config.name, "url": config.options.get("url"),
                            "wall_s": config.limits.wall_s, "built": type(default_sandbox()).__name__}) + "\\n")
    return 0.0
"""


def test_the_sandbox_section_reaches_reward_workers(tmp_path, tiny_model_path, monkeypatch):
    monkeypatch.setenv(SANDBOX_ENV, "")  # the trainer sets it; restored after the test
    files = task.write_task(tmp_path / "task")
    reward = tmp_path / "recording_reward.py"
    reward.write_text(RECORDING_REWARD)
    seen = tmp_path / "seen.jsonl"
    config = task.task_config(
        tmp_path,
        files,
        model__path=tiny_model_path,
        trainer__total_steps=1,
        trainer__val_before_train="false",
        reward__custom_function_path=str(reward),
        reward__custom_function_kwargs__out=str(seen),
        reward__num_workers=1,
        sandbox__name="http",
        sandbox__options__url="http://127.0.0.1:9",
        sandbox__limits__wall_s=7,
    )
    run_training(config, console=Console(file=io.StringIO(), width=200))
    records = [json.loads(line) for line in seen.read_text().splitlines()]
    assert records, "the reward function never ran"
    assert {r["pid"] for r in records} != {os.getpid()}  # scored in the worker process
    assert {(r["name"], r["url"], r["wall_s"], r["built"]) for r in records} == {
        ("http", "http://127.0.0.1:9", 7.0, "HttpSandbox")
    }

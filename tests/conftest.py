"""Runs shared by the end-to-end modules."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

RLCORE = Path(sys.executable).with_name("rlcore")
#: Steps of the shared default run (of the built-in task's 25: its validation reward is near 0.9 by then).
DEFAULT_RUN_STEPS = 20


def run_rlcore_train(tmp_path: Path, name: str, *overrides: str) -> tuple[str, Path]:
    """Run ``rlcore train`` with ``overrides`` into ``tmp_path/runs/name``; returns (output, run dir)."""
    env = {
        **os.environ,
        "RLCORE_CACHE_DIR": str(tmp_path / "cache"),  # the built-in model is built like on a fresh machine
        "COLUMNS": "200",
    }
    env.pop("RAY_ADDRESS", None)
    args = [
        str(RLCORE),
        "train",
        f"trainer.output_dir={tmp_path / 'runs'}",
        f"trainer.experiment_name={name}",
    ]
    proc = subprocess.run(
        [*args, *overrides], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    return output, tmp_path / "runs" / name


@pytest.fixture
def rlcore_train() -> Callable[..., tuple[str, Path]]:
    """:func:`run_rlcore_train`."""
    return run_rlcore_train


@pytest.fixture(scope="session")
def default_run(tmp_path_factory) -> tuple[str, Path]:
    """The README's main job, ``rlcore train`` at its defaults, for ``DEFAULT_RUN_STEPS`` steps: checked by
    test_e2e_train and the synchronous reference of test_e2e_async (one run for both)."""
    return run_rlcore_train(
        tmp_path_factory.mktemp("default"), "default", f"trainer.total_steps={DEFAULT_RUN_STEPS}"
    )


def _train_env(tmp_path: Path) -> dict[str, str]:
    """The environment of an ``rlcore train`` subprocess: the built-in model built like on a fresh machine,
    no Ray cluster to join."""
    env = {**os.environ, "RLCORE_CACHE_DIR": str(tmp_path / "cache"), "COLUMNS": "200"}
    env.pop("RAY_ADDRESS", None)
    return env


def _kill_after_steps(args: list[str], env: dict[str, str], cwd: Path, run_dir: Path, steps: int = 5) -> None:
    """Start ``args`` (an ``rlcore train``) and SIGKILL it, with everything it started (Ray included), once
    ``trained_samples.jsonl`` lists ``steps`` steps; fail if the run ends first."""
    from rlcore.telemetry.samples import SAMPLES_FILE, read_samples

    proc = subprocess.Popen(
        args, env=env, cwd=cwd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            samples = run_dir / SAMPLES_FILE
            if samples.is_file() and len(read_samples(samples)) >= steps:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before it could be killed"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture
def train_env() -> Callable[[Path], dict[str, str]]:
    """:func:`_train_env`."""
    return _train_env


@pytest.fixture
def kill_after_steps() -> Callable[..., None]:
    """:func:`_kill_after_steps`."""
    return _kill_after_steps

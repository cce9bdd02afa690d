"""Runs shared by the end-to-end modules."""

from __future__ import annotations

import os
import subprocess
import sys
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

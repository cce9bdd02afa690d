"""Runs rlcore's TrainEngine contract suite against the Megatron engine in a separate pytest process
(see ``megatron_contract_suite.py`` for why)."""

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.timeout(900)
def test_megatron_engine_passes_the_train_engine_contract():
    suite = Path(__file__).with_name("megatron_contract_suite.py")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", str(suite)],
        capture_output=True,
        text=True,
        timeout=880,
        cwd=Path(__file__).parents[3],
    )
    assert proc.returncode == 0, f"contract suite failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"

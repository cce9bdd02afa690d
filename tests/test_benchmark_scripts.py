"""The GPU benchmark scripts stay runnable: their CPU smoke modes (tiny model, gloo) run end to end.

Their GPU numbers live in docs/benchmarks.md; this only guards the scripts against rot (a renamed engine
option, a changed batch layout), checking that every system produced a timed row.
"""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_fsdp_train_tiny_runs_every_system_on_one_and_two_ranks(tmp_path):
    out = tmp_path / "fsdp.json"
    systems = ["hf-naive", "fsdp-mp", "fsdp-mp-varlen", "fsdp-bf16-varlen"]
    cmd = [sys.executable, "benchmarks/fsdp_train.py", "--tiny", "--gpus", "1", "2", "--out", str(out)]
    cmd += ["--systems", *systems, "--reduce-grads-once-per-step", "--no-reshard-after-forward"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    assert sorted((r["gpus"], r["system"]) for r in rows) == sorted((g, s) for g in (1, 2) for s in systems)
    for row in rows:
        assert row["error"] is None, row
        assert row["tokens_per_s"] > 0 and len(row["step_s"]) == 2

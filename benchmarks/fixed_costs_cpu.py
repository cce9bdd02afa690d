"""The fixed costs of a small GRPO step on CPU, each change before/after in one run (issue 19, item 3).

The workload of ``benchmarks/vs_trl_cpu.py`` (tiny Qwen2, 2-digit additions, verl-schema jsonl, the user
reward file), ``rlcore train --rollout hf`` at 8 prompts x 4 samples x 32 tokens, in variants that put
back, one at a time, what this change took away. Each variant is ``rlcore train`` with overrides and an
environment, run in its own process, all variants interleaved ``--repeats`` times (A B C D A B C D ...)
so that load from other jobs falls on every variant alike:

- ``before``: 8 rows per micro-batch (the old ``actor.micro_batch_size`` default), the post-sync check
  after every sync (``transport.check_interval=1``), one CPU thread per worker (``OMP_NUM_THREADS=1``,
  what Ray gave a worker with a fractional CPU reservation);
- ``+tokens``: ``before`` with micro-batches by token budget (the new default);
- ``+threads``: ``+tokens`` with the workers' threads the bundle's cores (the new default);
- ``after``: the defaults (``+threads`` with the post-sync check every 10 steps after the first two).

Per variant: the median over repeats of each run's median ``timing/*`` over steps 3..N, the runs' range of
``timing/step``, and process wall.

    python benchmarks/fixed_costs_cpu.py [--steps 20] [--repeats 3] [--out benchmarks/results/vs_trl_cpu/fixed_costs.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_trl_cpu as workload  # noqa: E402  (the shared model, prompts and command line)

ROOT = Path(__file__).resolve().parents[1]
OLD = ["actor.micro_batch_size=8", "transport.check_interval=1"]
VARIANTS = {
    "before": (OLD, {"OMP_NUM_THREADS": "1"}),
    "+tokens": (["transport.check_interval=1"], {"OMP_NUM_THREADS": "1"}),
    "+threads": (["transport.check_interval=1"], {}),
    "after": ([], {}),
}
PHASES = ("timing/step", "timing/generate", "timing/update_actor", "timing/sync_weights", "timing/score")


def run(variant: str, repeat: int, steps: int, inputs: dict, work: Path) -> dict:
    overrides, env = VARIANTS[variant]
    run_dir = work / "runs" / f"{variant.strip('+')}-{repeat}"
    cmd = workload.rlcore_command("hf", "small", steps, run_dir, inputs, overrides)
    environ = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env={**environ, **env}, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"{variant} run {repeat} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("step", 0) >= 3 and "timing/step" in r]
    return {
        "variant": variant,
        "repeat": repeat,
        "wall_s": wall,
        **{k: statistics.median(r[k] for r in rows if k in r) for k in PHASES if any(k in r for r in rows)},
    }


def summarise(runs: list[dict]) -> dict:
    out = {}
    for variant in VARIANTS:
        mine = [r for r in runs if r["variant"] == variant]
        out[variant] = {k: statistics.median(r[k] for r in mine) for k in (*PHASES, "wall_s") if k in mine[0]}
        out[variant]["step_range"] = [
            min(r["timing/step"] for r in mine),
            max(r["timing/step"] for r in mine),
        ]
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/rlcore-fixed-costs"))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/vs_trl_cpu/fixed_costs.json")
    args = parser.parse_args(argv)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    inputs = {
        "model": workload.build_model(args.work_dir / "model"),
        "data": workload.write_prompts(args.work_dir / "addition.jsonl", 512),
    }
    runs = []
    for repeat in range(args.repeats):
        for variant in args.variants:
            runs.append(run(variant, repeat, args.steps, inputs, args.work_dir))
            r = runs[-1]
            print(
                f"{variant:9s} #{repeat}: step {r['timing/step']:.3f} s, wall {r['wall_s']:.1f} s", flush=True
            )
    summary = summarise(runs)
    command = f"python benchmarks/fixed_costs_cpu.py --steps {args.steps} --repeats {args.repeats}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"command": command, "hardware": workload.hardware(), "runs": runs, "summary": summary}, indent=2
        )
    )
    print(
        "\n| variant | s/step (range) | generate | update_actor | sync_weights | wall |\n|---|---|---|---|---|---|"
    )
    for variant, s in summary.items():
        print(
            f"| {variant} | {s['timing/step']:.3f} ({s['step_range'][0]:.3f}-{s['step_range'][1]:.3f}) | "
            f"{s['timing/generate']:.3f} | {s['timing/update_actor']:.3f} | {s['timing/sync_weights']:.3f} | "
            f"{s['wall_s']:.1f} s |"
        )
    print(f"\n{workload.hardware()}\n`{command}`")


if __name__ == "__main__":
    main()

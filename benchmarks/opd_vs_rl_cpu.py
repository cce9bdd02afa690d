"""On-policy distillation against RL from the same start: SmolLM2-135M-Instruct on the built-in task
``addition``, on this CPU (row ``smollm2-opd-vs-rl-cpu``).

1. RL: the task's recipe (GRPO, 8 problems x 8 samples, 10 steps), validated every step (greedy accuracy
   on the 200 held-out sums); its last checkpoint, exported as a Hugging Face folder, is the teacher.
2. OPD: the same start (SmolLM2-135M-Instruct), the same recipe and batch, ``algorithm.name=opd
   teacher.model_path=<the RL model>``, validated every step.

Reported: both accuracy curves per step and per second of training (the steps' own wall time,
``timing/step``; validation excluded on both sides), the accuracy at equal steps and at equal wall time,
and the goal: OPD reaches RL's final accuracy in at most a third of RL's steps.

    python benchmarks/opd_vs_rl_cpu.py --name opd-vs-rl                 # both runs (about 40 min here)
    python benchmarks/opd_vs_rl_cpu.py --name opd-vs-rl --rl-run DIR     # reuse a finished RL run
    python benchmarks/opd_vs_rl_cpu.py --name short --opd-steps 4        # the goal's steps only
    python benchmarks/opd_vs_rl_cpu.py --name lr --rl-run DIR --opd actor.optim.lr=3e-5   # OPD only
    python benchmarks/opd_vs_rl_cpu.py --name t20 --rl-run DIR --teacher-run DIR20   # a teacher trained longer

Writes ``benchmarks/results/opd-vs-rl/<name>.json`` and ``<name>.png``; extra ``key=value`` arguments go
to both ``rlcore train`` commands.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from rlcore.telemetry.loggers import METRICS_FILE, read_metrics

sys.path.insert(0, str(Path(__file__).resolve().parent))
from smollm2_task_cpu import TASKS, difference_interval, hardware, wilson  # noqa: E402

HELD_OUT = TASKS["addition"][3]

RESULTS = Path(__file__).resolve().parent / "results" / "opd-vs-rl"
TASK = "data.train_files=[builtin:addition/train.jsonl]"
#: Both runs validate after every step (the curves' points).
COMMON = (TASK, "trainer.val_freq=1")
RL_STEPS = 10  # the recipe's


def run(rlcore: list[str], out: Path, name: str, overrides: list[str]) -> float:
    """``rlcore train`` into ``out/name``; returns its wall time in seconds."""
    command = [*rlcore, "train", f"trainer.output_dir={out}", f"trainer.experiment_name={name}", *overrides]
    print("$ rlcore train", " ".join(overrides), flush=True)
    start = time.perf_counter()
    proc = subprocess.run(command)
    if proc.returncode != 0:
        raise SystemExit(f"rlcore train failed (exit {proc.returncode}); its run directory is {out / name}")
    return time.perf_counter() - start


def curve(run_dir: Path) -> list[dict]:
    """``[{step, accuracy, train_s}]``: held-out accuracy after each validated step and the training wall
    time up to it (the sum of ``timing/step``, validation and start-up excluded)."""
    points, train_s = [], 0.0
    for record in read_metrics(run_dir / METRICS_FILE):
        train_s += record.get("timing/step", 0.0)
        if "val/reward" in record:
            points.append({"step": record["step"], "accuracy": record["val/reward"], "train_s": train_s})
    return points


def at_time(points: list[dict], seconds: float) -> dict:
    """The last point validated within ``seconds`` of training."""
    return [p for p in points if p["train_s"] <= seconds + 1e-9][-1]


def compare(rl: list[dict], opd: list[dict]) -> dict:
    """Accuracy at equal steps and equal wall time, and the goal (OPD at RL's final accuracy within a
    third of RL's steps)."""
    final = rl[-1]
    budget = final["step"] / 3
    reached = next((p for p in opd if p["step"] > 0 and p["accuracy"] >= final["accuracy"]), None)
    last = opd[-1]
    rl_at_opd_time = at_time(rl, last["train_s"])
    opd_at_rl_time = at_time(opd, final["train_s"])
    equal_steps = {
        str(p["step"]): {"rl": r["accuracy"], "opd": p["accuracy"]}
        for p in opd
        for r in rl
        if r["step"] == p["step"]
    }
    return {
        "rl_final": final,
        "opd_last": last,
        "equal_steps": equal_steps,
        "equal_time": {
            "opd_at_its_last_step": last,
            "rl_at_that_training_time": rl_at_opd_time,
            "rl_at_its_last_step": final,
            "opd_at_that_training_time": opd_at_rl_time,
        },
        "opd_step_reaching_rl_final": None if reached is None else reached["step"],
        "goal": {
            "rl_final_accuracy": final["accuracy"],
            "max_steps": budget,
            "met": reached is not None and reached["step"] <= budget,
            "evaluated": last["step"] >= math.floor(budget) or reached is not None,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="opd-vs-rl", help="result file name (and run names)")
    parser.add_argument("--rl-run", type=Path, help="a finished RL run directory to reuse (its teacher too)")
    parser.add_argument(
        "--teacher-run",
        type=Path,
        help="a finished run whose last checkpoint is the teacher (default: the RL run's), e.g. the RL run "
        "resumed for more steps",
    )
    parser.add_argument("--opd-steps", type=int, default=RL_STEPS, help="OPD steps (default: RL's 10)")
    parser.add_argument("--out", type=Path, help="where the runs go (default: a new folder under /tmp)")
    parser.add_argument("--rlcore", default=str(Path(sys.executable).with_name("rlcore")))
    parser.add_argument(
        "--opd",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override for the OPD run only (repeatable), e.g. --opd actor.optim.lr=3e-5",
    )
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for both runs")
    args = parser.parse_args(argv)
    rlcore = shlex.split(args.rlcore)
    out = args.out or Path(f"/tmp/opd-vs-rl-{args.name}")
    out.mkdir(parents=True, exist_ok=True)

    rl_dir, rl_wall = args.rl_run, None
    if rl_dir is None:
        rl_dir = out / f"{args.name}-rl"
        rl_wall = run(rlcore, out, rl_dir.name, [*COMMON, *args.overrides])
    teacher_run = args.teacher_run or rl_dir
    checkpoint = max((teacher_run / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    teacher = out / f"{args.name}-teacher"
    if not (teacher / "config.json").is_file():
        subprocess.run([*rlcore, "export", str(checkpoint), "--out", str(teacher)], check=True)
    opd = [
        *COMMON,
        "algorithm.name=opd",
        f"teacher.model_path={teacher}",
        f"trainer.total_steps={args.opd_steps}",
        *args.overrides,
        *args.opd,
    ]
    opd_wall = run(rlcore, out, f"{args.name}-opd", opd)

    rl_points, opd_points = curve(rl_dir), curve(out / f"{args.name}-opd")
    opd_records = [r for r in read_metrics(out / f"{args.name}-opd" / METRICS_FILE) if r["step"] > 0]
    result = {
        "row": "smollm2-opd-vs-rl-cpu",
        "name": args.name,
        "commands": {
            "rl": "rlcore train " + " ".join([*COMMON, *args.overrides]),
            "export": f"rlcore export {checkpoint} --out TEACHER",
            "opd": "rlcore train " + " ".join(opd).replace(str(teacher), "TEACHER"),
        },
        "held_out": HELD_OUT,
        "teacher_checkpoint": str(checkpoint),
        "teacher_val": curve(teacher_run)[-1]["accuracy"],
        "rl": rl_points,
        "opd": opd_points,
        "rl_wall_s": rl_wall,
        "opd_wall_s": opd_wall,
        "opd_reverse_kl": [r.get("distill/reverse_kl") for r in opd_records],
        "opd_teacher_s": [r.get("timing/teacher_log_probs") for r in opd_records],
        "opd_step_s": [r.get("timing/step") for r in opd_records],
        "comparison": compare(rl_points, opd_points),
        "ci95": {
            "rl_final": wilson(rl_points[-1]["accuracy"], HELD_OUT),
            "opd_last": wilson(opd_points[-1]["accuracy"], HELD_OUT),
            "opd_minus_rl_at_equal_last_step_points": [
                100 * x
                for x in difference_interval(rl_points[-1]["accuracy"], opd_points[-1]["accuracy"], HELD_OUT)
            ],
        },
        "cpus": os.cpu_count(),
        "hardware": hardware(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, RESULTS / f"{args.name}.png")
    goal = result["comparison"]["goal"]
    print(
        f"RL {rl_points[0]['accuracy']:.3f} -> {rl_points[-1]['accuracy']:.3f} in {rl_points[-1]['step']} steps; "
        f"OPD {opd_points[0]['accuracy']:.3f} -> {opd_points[-1]['accuracy']:.3f} in {opd_points[-1]['step']} "
        f"steps; OPD reached RL's final accuracy at step {result['comparison']['opd_step_reaching_rl_final']} "
        f"(goal: <= {goal['max_steps']:.2f}: {'met' if goal['met'] else 'not met'}); {RESULTS / (args.name + '.json')}"
    )
    return 0


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for label, points in (("RL (GRPO)", result["rl"]), ("OPD from the RL model", result["opd"])):
        acc = [p["accuracy"] for p in points]
        axes[0].plot([p["step"] for p in points], acc, marker="o", label=label)
        axes[1].plot([p["train_s"] / 60 for p in points], acc, marker="o", label=label)
    if result.get("teacher_val") is not None:
        for ax in axes:
            ax.axhline(result["teacher_val"], ls=":", color="gray", label="the teacher")
    axes[0].set_xlabel("step")
    axes[1].set_xlabel("training wall time (min, validation excluded)")
    axes[0].set_ylabel(f"accuracy on {result['held_out']} held-out sums")
    axes[0].set_ylim(0, 1)
    axes[0].legend(loc="lower right")
    fig.suptitle(f"SmolLM2-135M-Instruct on addition, {result['hardware']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())

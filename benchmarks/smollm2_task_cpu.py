"""Does RL make a real model better? SmolLM2-135M-Instruct on a built-in task, on this CPU.

Runs ``rlcore train data.train_files=[builtin:TASK/train.jsonl]`` (the task's recipe: the real model,
GRPO, greedy validation on 200 held-out problems before training and every ``val_freq`` steps) and
reports held-out accuracy before -> after with 95% confidence intervals, the wall time, and the curve.
``--task addition`` (the default) answers sums directly; ``--task tool_sum`` answers with the calculator
tool (an agent run: docs/agents.md). ``--agent program`` or ``--agent command`` runs the ``tool_sum``
episodes, validation included, through ``examples/agents/calculator_agent.py`` (an agent written with the
``openai`` package only, over the rollout workers' chat endpoint) instead of the built-in agent loop, with
the same recipe: ``agent.program=calculator_agent:agent`` (that folder on ``PYTHONPATH``, called in the
rollout worker) or ``agent.command=[python, examples/agents/calculator_agent.py]`` (one process per
episode).

    python benchmarks/smollm2_task_cpu.py --name full            # the recipe as it is
    python benchmarks/smollm2_task_cpu.py --name full-rerun      # the independent re-run of a row
    python benchmarks/smollm2_task_cpu.py --task tool_sum --name tool
    python benchmarks/smollm2_task_cpu.py --task tool_sum --agent program --name openai-agent rollout.engine=vllm

Writes ``benchmarks/results/smollm2-task/<name>.json`` (``smollm2-tool-task/`` for ``tool_sum``,
``smollm2-openai-agent/`` with ``--agent``: the command, the accuracy before and after, the intervals, the
wall time, every validation point), ``<name>.png`` and the run's per-step metrics
``<name>-metrics.jsonl``; extra ``key=value`` arguments are passed to ``rlcore train``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlcore.telemetry.loggers import METRICS_FILE, read_metrics

RESULTS = Path(__file__).resolve().parent / "results"
#: task -> (results folder, row name prefix, what the plot's y axis counts, held-out rows, model)
TASKS = {
    "addition": (
        "smollm2-task",
        "smollm2-task-accuracy-cpu-",
        "accuracy on 200 held-out sums",
        200,
        "SmolLM2-135M-Instruct",
    ),
    "tool_sum": (
        "smollm2-tool-task",
        "smollm2-tool-task-cpu-",
        "exact answers, 200 held-out (tool)",
        200,
        "SmolLM2-135M-Instruct",
    ),
    # The visual recipe (issue 54): its own model (builtin:tiny-vlm) and an SFT warm-up, so "before" is
    # the held-out accuracy after the warm-up, where RL starts.
    "count_shapes": (
        "count-shapes-gpu",
        "count-shapes-",
        "accuracy on 128 held-out images",
        128,
        "the tiny Qwen2.5-VL",
    ),
}
#: --agent -> (results folder, row name prefix) of the runs whose episodes an agent program drives.
AGENT_PROGRAMS = {
    "program": ("smollm2-openai-agent", "smollm2-openai-agent-cpu-"),
    "command": ("smollm2-openai-agent", "smollm2-openai-agent-command-cpu-"),
}
AGENT_TASKS = ("tool_sum",)
#: The example agent (the ``openai`` package only) and its folder, put on PYTHONPATH for ``--agent program``.
EXAMPLE_AGENTS = Path(__file__).resolve().parents[1] / "examples" / "agents"
MISMATCH_KEYS = ("sync/", "rollout/logprob_diff", "rollout/mismatch")
Z95 = 1.959964


def wilson(p: float, n: int) -> tuple[float, float]:
    """95% Wilson score interval of a proportion ``p`` observed on ``n`` items."""
    denom = 1 + Z95**2 / n
    centre = (p + Z95**2 / (2 * n)) / denom
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / denom
    return centre - half, centre + half


def difference_interval(before: float, after: float, n: int) -> tuple[float, float]:
    """95% interval of ``after - before`` treating the two evaluations as independent samples of ``n``
    items (the same items are scored twice, so this is wider than a paired interval: conservative)."""
    half = Z95 * math.sqrt(before * (1 - before) / n + after * (1 - after) / n)
    return after - before - half, after - before + half


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="addition", help="the built-in task")
    parser.add_argument("--name", default="full", help="result file name (and run name)")
    parser.add_argument(
        "--rlcore",
        default=str(Path(sys.executable).with_name("rlcore")),
        help="the rlcore command (split like a shell line: the GPU stage runs it through python3 -c)",
    )
    parser.add_argument(
        "--agent",
        choices=["loop", *AGENT_PROGRAMS],
        default="loop",
        help="who drives a tool_sum episode: the built-in loop, or examples/agents/calculator_agent.py as "
        "agent.program (in the rollout worker) or agent.command (a process per episode)",
    )
    parser.add_argument("--row", help="row name (default: the task's row prefix, then NAME)")
    parser.add_argument("--results", type=Path, help="where NAME.json and NAME.png go")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for rlcore train")
    args = parser.parse_args(argv)
    folder, row_prefix, y_label, held_out, _ = TASKS[args.task]
    agent_overrides, env = agent_program(args.agent)
    if agent_overrides:
        if args.task not in AGENT_TASKS:
            parser.error(f"--agent {args.agent} needs an agent task ({', '.join(AGENT_TASKS)})")
        folder, row_prefix = AGENT_PROGRAMS[args.agent]
    results = args.results or RESULTS / folder
    task = f"data.train_files=[builtin:{args.task}/train.jsonl]"
    overrides = [*agent_overrides, *args.overrides]

    out = Path(tempfile.mkdtemp(prefix="smollm2-task-"))
    command = [
        *shlex.split(args.rlcore),
        "train",
        task,
        f"trainer.output_dir={out}",
        f"trainer.experiment_name={args.name}",
        *overrides,
    ]
    prefix = "".join(f"{k}={v} " for k, v in env.items())
    print(f"$ {prefix}rlcore train", " ".join(command[command.index("train") + 1 :]), flush=True)
    start = time.perf_counter()
    proc = subprocess.run(command, env={**os.environ, **env})
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        print(
            f"rlcore train failed (exit {proc.returncode}); its run directory is {out / args.name}",
            file=sys.stderr,
        )
        return proc.returncode
    records = read_metrics(out / args.name / METRICS_FILE)
    curve = [(r["step"], r["val/reward"]) for r in records if "val/reward" in r]
    (_, before), (s1, after) = curve[0], curve[-1]
    # With an SFT warm-up, RL starts from the accuracy after it (the step-0 record holds both).
    before_sft = None
    if "val/reward_after_sft" in records[0]:
        before_sft, before = before, records[0]["val/reward_after_sft"]
    result = {
        "row": args.row or f"{row_prefix}{args.name}",
        "task": args.task,
        "agent": args.agent,
        "command": prefix + "rlcore train " + " ".join([task, *overrides]),
        "held_out": held_out,
        "before_sft": before_sft,
        "before": before,
        "after": after,
        "steps": s1,
        "before_ci95": wilson(before, held_out),
        "after_ci95": wilson(after, held_out),
        "gain_points": 100 * (after - before),
        "gain_ci95_points": [100 * x for x in difference_interval(before, after, held_out)],
        "wall_s": wall,
        "curve": curve,
        # The rollout/trainer gap each step and at each post-sync check (issue 53).
        "mismatch": [
            {k: v for k, v in r.items() if k == "step" or k.startswith(MISMATCH_KEYS)} for r in records
        ],
        # How the episodes went each step (stop reasons, requests, history edits ...).
        "agent_metrics": [
            {k: v for k, v in r.items() if k == "step" or k.startswith(("agent/", "val/agent/"))}
            for r in records
            if any(k.startswith(("agent/", "val/agent/")) for k in r)
        ],
        "cpus": os.cpu_count(),
        "hardware": hardware(),
    }
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    shutil.copyfile(out / args.name / METRICS_FILE, results / f"{args.name}-metrics.jsonl")
    plot(result, results / f"{args.name}.png", y_label)
    print(
        f"held-out accuracy {before:.3f} -> {after:.3f} ({result['gain_points']:+.1f} points, 95% CI "
        f"{result['gain_ci95_points'][0]:+.1f} .. {result['gain_ci95_points'][1]:+.1f}) in {s1} steps, "
        f"{wall / 60:.1f} min wall; {results / (args.name + '.json')}"
    )
    return 0


def agent_program(agent: str) -> tuple[list[str], dict[str, str]]:
    """The ``rlcore train`` overrides and environment variables that make the example agent program
    (``examples/agents/calculator_agent.py``) drive the episodes; none for the built-in loop."""
    if agent == "program":
        path = os.pathsep.join(p for p in (str(EXAMPLE_AGENTS), os.environ.get("PYTHONPATH")) if p)
        return ["agent.program=calculator_agent:agent"], {"PYTHONPATH": path}
    if agent == "command":
        return [f"agent.command=[{sys.executable}, {EXAMPLE_AGENTS / 'calculator_agent.py'}]"], {}
    return [], {}


def hardware() -> str:
    """The GPU's name when there is one (the run trains there), else the CPU count."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"{os.cpu_count()} CPUs"


def plot(result: dict, path: Path, y_label: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, acc = zip(*result["curve"], strict=True)
    lo, hi = zip(*(wilson(a, result["held_out"]) for a in acc), strict=True)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(steps, acc, marker="o", label="held-out accuracy (greedy)")
    ax.fill_between(steps, lo, hi, alpha=0.2, label="95% interval")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel(y_label)
    ax.set_ylim(0, 1)
    ax.set_title(
        f"{TASKS[result.get('task', 'addition')][4]} on {result.get('task', 'addition')}, {result['wall_s'] / 60:.1f} min on "
        f"{result.get('hardware', str(result['cpus']) + ' CPUs')}",
        fontsize=10,
    )
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())

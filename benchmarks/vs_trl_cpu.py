"""GRPO on CPU, rlcore next to TRL: ``rlcore train`` and TRL's ``GRPOTrainer`` on the same tiny model,
prompts, reward and settings (issue 19).

The workload is what a new user tries first: the built-in tiny Qwen2 model (``rlcore.testing.tiny``,
1.4M parameters, fp32) built once into a folder both systems load, a 2-digit-addition prompt set in
verl's schema (jsonl: ``prompt`` as chat messages, ``data_source``, ``reward_model.ground_truth``)
written here, and the user reward file ``benchmarks/addition_reward.py`` with verl's ``compute_score``
(rlcore: ``reward.custom_function_path``; TRL: a reward function calling the same ``compute_score``).
Both run GRPO with lr 1e-3 constant, no KL (rlcore ``algorithm.use_kl_loss=false``, TRL ``beta=0``),
clip 0.2, token-mean loss, std-normalised group advantages, one update per generation batch,
temperature 1, and write a final checkpoint. Sizes are prompts x samples x max new tokens:
``small`` 8 x 4 x 32 and ``large`` 64 x 8 x 128 (``tiny``, 2 x 2 x 8, is the CI smoke size).

Each run is its own subprocess, and runs are interleaved (A B A B ...) so that load from other jobs on a
shared machine falls on every system alike. Per run:

- s/step: the median over steps 3..N (the first two hold one-off costs: compilation, caches, allocator
  growth). rlcore: ``timing/step`` from the run's ``metrics.jsonl`` (generate, reward, update, weight
  sync); TRL: a ``TrainerCallback`` timing ``on_step_begin`` -> ``on_step_end`` (the same phases:
  TRL generates inside its training step).
- wall: the process from start to exit (imports, Ray, engines, the steps, the checkpoint).
- peak memory: the process tree polled every ``--poll-s``: the largest sum of RSS over the driver and
  every child (for rlcore: Ray's processes and every worker), and the same for PSS (shared pages split
  between the processes that map them; RSS counts torch's libraries once per process).

Writes per size ``OUT_DIR/<size>.json`` (every run's per-step times and rewards) and
``OUT_DIR/<size>-rewards.png`` (the reward curves of every run of both systems), and prints markdown rows ``| name | value | unit | hardware | command |``.

    python benchmarks/vs_trl_cpu.py [--sizes small large] [--steps 20] [--large-steps 20] [--repeats 2]
        [--systems trl rlcore-vllm rlcore-hf rlcore-hybrid rlcore-defaults] [--out-dir benchmarks/results/vs_trl_cpu]

Needs TRL (``pip install -c constraints-cpu.txt -r benchmarks/requirements-trl.txt``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
from _machine import cpu_name  # benchmarks/, the script's folder, leads sys.path

ROOT = Path(__file__).resolve().parents[1]
REWARD_FILE = Path(__file__).resolve().parent / "addition_reward.py"
SIZES = {"tiny": (2, 2, 8), "small": (8, 4, 32), "large": (64, 8, 128)}
SYSTEMS = ("trl", "rlcore-vllm", "rlcore-hf", "rlcore-hybrid", "rlcore-defaults")
#: rlcore's systems: ``--rollout`` and extra overrides. ``hybrid``: the HF rollout built inside the actor's
#: Ray actor (``trainer.placement=hybrid``), loading its weights there, as TRL generates with the model it
#: trains, on Ray (the CPU defaults before ``trainer.backend: auto``). ``defaults``: what ``rlcore train``
#: picks on this machine (``auto`` rollout, placement and backend: on a CPU, the hybrid layout with every
#: role in the ``rlcore`` process, no Ray).
RLCORE_SYSTEMS = {
    "rlcore-vllm": ("vllm", ["trainer.placement=colocated"]),
    "rlcore-hf": ("hf", ["trainer.placement=colocated"]),
    "rlcore-hybrid": ("hf", ["trainer.placement=hybrid", "trainer.backend=ray"]),
    "rlcore-defaults": ("auto", []),
}
LR = 1e-3
SEED = 0
DATA_SOURCE = "addition"


# ----------------------------------------------------------------------------------------------------
# the shared inputs: model folder, prompt file


def write_prompts(path: Path, count: int, seed: int = SEED) -> Path:
    """``count`` 2-digit additions in verl's schema, as jsonl."""
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"split": "train", "index": index},
            }
        )
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def build_model(path: Path) -> Path:
    from rlcore.testing.tiny import build_tiny_model

    return build_tiny_model(path)


# ----------------------------------------------------------------------------------------------------
# the commands


def rlcore_command(rollout: str, size: str, steps: int, run_dir: Path, inputs: dict, overrides) -> list:
    prompts, samples, tokens = SIZES[size]
    rlcore = Path(sys.executable).with_name("rlcore")
    return [
        str(rlcore),
        "train",
        "--rollout",
        rollout,
        f"model.path={inputs['model']}",
        f"data.train_files=[{inputs['data']}]",
        f"data.train_batch_size={prompts}",
        f"rollout.n={samples}",
        f"rollout.max_response_length={tokens}",
        "rollout.temperature=1.0",
        f"actor.optim.lr={LR}",
        "algorithm.use_kl_loss=false",
        f"trainer.total_steps={steps}",
        f"trainer.seed={SEED}",
        "trainer.val_before_train=false",
        # no tensorboard: TRL reports to nothing either; jsonl holds the timings read here
        "trainer.loggers=[console,jsonl]",
        f"trainer.output_dir={run_dir.parent}",
        f"trainer.experiment_name={run_dir.name}",
        f"reward.custom_function_path={REWARD_FILE}",
        *overrides,
    ]


def trl_command(size: str, steps: int, run_dir: Path, inputs: dict) -> list:
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--trl-child",
        run_dir,
        "--sizes",
        size,
        "--steps",
        str(steps),
        "--model",
        inputs["model"],
        "--data",
        inputs["data"],
    ]


# ----------------------------------------------------------------------------------------------------
# the TRL run (in its own process: ``--trl-child``)


def load_compute_score():
    spec = importlib.util.spec_from_file_location("addition_reward", REWARD_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compute_score


def trl_reward(compute_score):
    """A TRL reward function over verl's columns; TRL hands every dataset column as a keyword list."""

    def addition(completions, data_source, reward_model, extra_info=None, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        extras = extra_info or [None] * len(texts)
        return [
            float(compute_score(source, text, truth["ground_truth"], extra))
            for source, text, truth, extra in zip(data_source, texts, reward_model, extras, strict=True)
        ]

    return addition


def step_timer(path: Path):
    """A callback appending ``{"step", "s", "reward"}`` per step to ``path`` (the parent reads it live)."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.started = None
            self.seconds = {}

        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.seconds[state.global_step] = time.perf_counter() - self.started

        def on_log(self, args, state, control, logs=None, **kwargs):
            # logging_steps=1: one log per step, right after on_step_end
            if logs and "reward" in logs and state.global_step in self.seconds:
                row = {
                    "step": state.global_step,
                    "s": self.seconds[state.global_step],
                    "reward": logs["reward"],
                }
                with path.open("a") as f:
                    f.write(json.dumps(row) + "\n")

    return StepTimer()


def trl_config(size: str, steps: int, output_dir: Path):
    from trl import GRPOConfig

    prompts, samples, tokens = SIZES[size]
    return GRPOConfig(
        output_dir=str(output_dir),
        # TRL counts completions per device batch: one generation batch of prompts x samples per step
        per_device_train_batch_size=prompts * samples,
        num_generations=samples,
        max_completion_length=tokens,
        temperature=1.0,
        learning_rate=LR,
        lr_scheduler_type="constant",  # rlcore's default schedule
        beta=0.0,
        max_steps=steps,
        logging_steps=1,
        # a final checkpoint with the optimizer state, as rlcore writes at its last step
        save_strategy="steps",
        save_steps=steps,
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,  # rlcore's default (TRL's is on: slower, less memory)
        seed=SEED,
        dataloader_pin_memory=False,
    )


def run_trl_child(args) -> None:
    from datasets import Dataset
    from trl import GRPOTrainer

    run_dir = Path(args.trl_child)
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines()]
    trainer = GRPOTrainer(
        model=str(args.model),
        reward_funcs=trl_reward(load_compute_score()),
        args=trl_config(args.sizes[0], args.steps, run_dir / "output"),
        train_dataset=Dataset.from_list(rows),
        callbacks=[step_timer(run_dir / "steps.jsonl")],
    )
    trainer.train()


# ----------------------------------------------------------------------------------------------------
# measuring a run from outside


def tree_memory(pid: int) -> tuple[int, int]:
    """``(sum of RSS, sum of PSS)`` in bytes over ``pid`` and all its descendants."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0
    rss = pss = 0
    for proc in processes:
        try:
            rss += proc.memory_info().rss
            pss += pss_bytes(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return rss, pss


def pss_bytes(pid: int) -> int:
    # smaps_rollup is one line per counter: far cheaper than psutil's full smaps walk
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def steps_done(path: Path) -> int:
    """Steps recorded so far (rlcore's metrics.jsonl also holds a step-0 sync line: only timed steps count)."""
    try:
        return sum('"s"' in line or "timing/step" in line for line in path.open())
    except OSError:
        return 0


def run_measured(cmd: list, log: Path, steps_file: Path, steps: int, label: str, poll_s: float) -> dict:
    """Run ``cmd`` with its output in ``log``; poll its process tree's memory and show its step count."""
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        peak = {"rss": 0, "pss": 0}
        stop = threading.Event()

        def poll():
            while not stop.is_set():
                rss, pss = tree_memory(proc.pid)
                peak["rss"], peak["pss"] = max(peak["rss"], rss), max(peak["pss"], pss)
                stop.wait(poll_s)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        shown = -1
        while proc.poll() is None:
            done = steps_done(steps_file)
            # a live step counter on a terminal; a log file gets only the final line
            if done != shown and sys.stdout.isatty():
                print(
                    f"\r  {label}: step {done}/{steps}, {time.perf_counter() - start:5.0f} s",
                    end="",
                    flush=True,
                )
                shown = done
            try:  # wakes at the exit, so that the wall time is not rounded up to the next second
                proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
        stop.set()
        poller.join()
    wall = time.perf_counter() - start
    print(f"\r  {label}: exit {proc.returncode}, {wall:.1f} s{' ' * 20}")
    return {
        "returncode": proc.returncode,
        "wall_s": wall,
        "peak_rss_bytes": peak["rss"],
        "peak_pss_bytes": peak["pss"],
    }


def read_steps(system: str, run_dir: Path) -> list[dict]:
    """Per step ``{"step", "s", "reward"}`` from the run's own records."""
    if system == "trl":
        path = run_dir / "steps.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [
        {"step": r["step"], "s": r["timing/step"], "reward": r.get("reward/mean")}
        for r in rows
        if "timing/step" in r
    ]


def median_step_s(steps: list[dict]) -> float | None:
    """Median over steps 3..N; with fewer than 3 steps (the smoke size), over all but the first."""
    times = [s["s"] for s in steps]
    if not times:
        return None
    skip = 2 if len(times) > 2 else min(1, len(times) - 1)
    return statistics.median(times[skip:])


# ----------------------------------------------------------------------------------------------------
# one size: the interleaved runs


def run_one(system: str, size: str, steps: int, repeat: int, args, inputs: dict) -> dict:
    run_dir = (args.work_dir / "runs" / f"{size}-{system}-{repeat}").resolve()
    if system == "trl":
        cmd, steps_file = trl_command(size, steps, run_dir, inputs), run_dir / "steps.jsonl"
    else:
        rollout, system_overrides = RLCORE_SYSTEMS[system]
        cmd = rlcore_command(
            rollout, size, steps, run_dir, inputs, [*system_overrides, *args.rlcore_override]
        )
        steps_file = run_dir / "metrics.jsonl"
    # a fresh folder: TRL's step timer appends, so an earlier run's steps would count again
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = run_dir.parent / f"{run_dir.name}.log"
    measured = run_measured(cmd, log, steps_file, steps, f"{size} {system} #{repeat}", args.poll_s)
    per_step = read_steps(system, run_dir)
    row = {"system": system, "size": size, "repeat": repeat, "steps": steps, **measured}
    row.update(median_step_s=median_step_s(per_step), per_step=per_step, log=str(log))
    if system != "trl" and (run_dir / "config.yaml").is_file():  # what auto resolved to, for the defaults
        import yaml

        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        trainer = config["trainer"]
        row.update(
            rollout_engine=config["rollout"]["engine"],
            placement=trainer["placement"],
            backend=trainer["backend"],
        )
    row["error"] = None if measured["returncode"] == 0 and len(per_step) == steps else log_tail(log)
    return row


def log_tail(log: Path, lines: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def run_size(size: str, steps: int, args, inputs: dict) -> list[dict]:
    runs = []
    total = args.repeats * len(args.systems)
    for repeat in range(args.repeats):
        for system in args.systems:
            print(
                f"[{len(runs) + 1}/{total}] {size} ({'x'.join(map(str, SIZES[size]))}), {system}, run {repeat}"
            )
            row = run_one(system, size, steps, repeat, args, inputs)
            if row["error"]:
                print(f"  failed:\n{row['error']}")
            else:
                print(
                    f"  {row['median_step_s']:.3f} s/step, wall {row['wall_s']:.1f} s, peak RSS "
                    f"{row['peak_rss_bytes'] / 2**30:.2f} GiB (PSS {row['peak_pss_bytes'] / 2**30:.2f} GiB)"
                )
            runs.append(row)
    return runs


# ----------------------------------------------------------------------------------------------------
# summaries, rows, plot


def summarise(runs: list[dict], systems: list[str]) -> dict:
    """Per system: medians over its runs; per rlcore system: s/step ratio to TRL, paired run by run
    (run i of both ran next to each other)."""
    out = {}
    for system in systems:
        ok = [r for r in runs if r["system"] == system and not r["error"]]
        if not ok:
            out[system] = {"runs": 0}
            continue
        out[system] = {
            "runs": len(ok),
            **{
                key: statistics.median(r[key] for r in ok)
                for key in ("median_step_s", "wall_s", "peak_rss_bytes", "peak_pss_bytes")
            },
            "step_s_range": [min(r["median_step_s"] for r in ok), max(r["median_step_s"] for r in ok)],
        }
    trl = {r["repeat"]: r for r in runs if r["system"] == "trl" and not r["error"]}
    for system in systems:
        pairs = [
            r["median_step_s"] / trl[r["repeat"]]["median_step_s"]
            for r in runs
            if r["system"] == system and system != "trl" and not r["error"] and r["repeat"] in trl
        ]
        if pairs:
            out[system]["ratio_to_trl"] = statistics.median(pairs)
            out[system]["ratio_to_trl_range"] = [min(pairs), max(pairs)]
            # load from other jobs only ever slows a run down: the fastest runs are the least disturbed
            out[system]["ratio_of_fastest_runs"] = (
                out[system]["step_s_range"][0] / out["trl"]["step_s_range"][0]
            )
    return out


def hardware() -> str:
    import torch

    cpu = cpu_name(platform.machine())
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, TRL {trl_version()}"


def source_state() -> dict:
    """The commit measured, and the files that differed from it (rlcore runs from the working tree)."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    status = subprocess.run(
        [*git, "status", "--porcelain", "--", "core", "plugins"], capture_output=True, text=True
    )
    return {"commit": head, "modified": [line[3:] for line in status.stdout.splitlines()]}


def trl_version() -> str:
    try:
        from importlib.metadata import version

        return version("trl")
    except Exception:  # noqa: BLE001 - only a label
        return "not installed"


def markdown_rows(size: str, summary: dict, command: str) -> list[str]:
    rows = []
    for system, s in summary.items():
        if "ratio_to_trl" in s:
            low, high = s["ratio_to_trl_range"]
            rows.append(
                f"| grpo-step-vs-trl-cpu-{size} ({system}) | {s['ratio_to_trl']:.2f} | rlcore s/step / TRL s/step "
                f"(runs {low:.2f}-{high:.2f}; fastest runs {s['ratio_of_fastest_runs']:.2f}) | {hardware()} | `{command}` |"
            )
    for system, s in summary.items():
        if s.get("runs"):
            rows.append(
                f"| grpo-{size}-{system} | {s['median_step_s']:.3f} | s/step (wall {s['wall_s']:.0f} s, peak RSS "
                f"{s['peak_rss_bytes'] / 2**30:.2f} GiB, PSS {s['peak_pss_bytes'] / 2**30:.2f} GiB) | same | same |"
            )
    return rows


def plot(runs: list[dict], size: str, path: Path) -> None:
    """Every run's reward curve, one colour per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    colours = dict(
        zip(SYSTEMS, ("tab:orange", "tab:blue", "tab:green", "tab:purple", "tab:red"), strict=True)
    )
    labelled = set()
    for run in runs:
        points = [(s["step"], s["reward"]) for s in run["per_step"] if s["reward"] is not None]
        if not points:
            continue
        label = None if run["system"] in labelled else run["system"]
        labelled.add(run["system"])
        ax.plot(*zip(*points, strict=True), color=colours[run["system"]], alpha=0.7, label=label)
    prompts, samples, tokens = SIZES[size]
    ax.set(title=f"GRPO, {prompts} prompts x {samples} samples x {tokens} tokens", xlabel="step")
    ax.set_ylabel("mean training reward")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=["small", "large"])
    parser.add_argument("--steps", type=int, default=20, help="steps per run")
    parser.add_argument("--large-steps", type=int, help="steps per run at the large size (default --steps)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per system and size, interleaved")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument(
        "--rlcore-override", action="append", default=[], metavar="KEY=VALUE", help="extra rlcore override"
    )
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks/results/vs_trl_cpu")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/rlcore-vs-trl"), help="model, data, runs")
    parser.add_argument("--poll-s", type=float, default=0.5, help="memory polling interval")
    # the TRL run's own process
    parser.add_argument("--trl-child", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def command_line(args, size: str, steps: int) -> str:
    cmd = f"python benchmarks/vs_trl_cpu.py --sizes {size} --steps {steps} --repeats {args.repeats}"
    cmd += f" --systems {' '.join(args.systems)}"
    cmd += "".join(f" --rlcore-override {o}" for o in args.rlcore_override)
    return cmd


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.trl_child:
        run_trl_child(args)
        return
    args.work_dir.mkdir(parents=True, exist_ok=True)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    longest = max(args.steps, args.large_steps or 0)
    inputs = {
        "model": build_model(args.work_dir / "model").resolve(),
        # enough prompts that no step repeats one: at most 64 prompts per step
        "data": write_prompts(args.work_dir / "addition.jsonl", max(2048, 64 * longest)).resolve(),
    }
    results, all_rows = {}, []
    for size in args.sizes:
        steps = args.large_steps if size == "large" and args.large_steps else args.steps
        load_before = os.getloadavg()[0]
        runs = run_size(size, steps, args, inputs)
        summary = summarise(runs, args.systems)
        command = command_line(args, size, steps)
        rows = markdown_rows(size, summary, command)
        all_rows += rows
        results[size] = runs
        record = {
            "command": command,
            "hardware": hardware(),
            "source": source_state(),
            "size": dict(zip(("prompts", "samples", "max_new_tokens"), SIZES[size], strict=True)),
            "steps": steps,
            "load_average": {"before": load_before, "after": os.getloadavg()[0]},
            "summary": summary,
            "rows": rows,
            "runs": runs,
        }
        (args.out_dir / f"{size}.json").write_text(json.dumps(record, indent=2))
        plot(runs, size, args.out_dir / f"{size}-rewards.png")
    print("\n| name | value | unit | hardware | command |\n|---|---|---|---|---|")
    print("\n".join(all_rows))
    failed = [r for runs in results.values() for r in runs if r["error"]]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

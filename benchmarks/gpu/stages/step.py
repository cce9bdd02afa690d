"""The whole GRPO step on one GPU (issue 16): rlcore's step phase by phase against its bound, and verl's
GRPO trainer on the same model and prompts, on the vLLM bundle (verl's beside it, first on PYTHONPATH).

Knobs, as environment variables: SHAPE (0.5B), STEP_OVERRIDES (more rlcore key=value), NAME / STEPS /
PROFILE / LIMIT (step-named), VARIANT ("name key=value ...", step-again), VERL_STEPS / VERL_TIMEOUT.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from ...grpo_step_tuning import FAST_PATH
from ..actions import PY, Ctx, Do, FreeGpu, Run, cmd
from .base import Stage

VERL_PATH = ("/tmp/proj", "/tmp/verl", "/tmp/vsite")
STEP = "benchmarks/grpo_step_gpu.py"


def _shape(ctx: Ctx) -> str:
    return ctx.knob("SHAPE", "0.5B")


def _overrides(ctx: Ctx) -> list[str]:
    return ctx.knob("STEP_OVERRIDES", "").split()


def _step(ctx: Ctx) -> list:
    s = _shape(ctx)
    argv = cmd(
        PY,
        STEP,
        "--shape",
        s,
        "--steps",
        "4",
        "--timeout",
        "520",
        "--out",
        f"{ctx.res}/grpo_step",
        _overrides(ctx),
    )
    return [FreeGpu(), Run(f"grpo-step-{s}", 560, argv)]


def _step_raw(ctx: Ctx) -> list:
    s = _shape(ctx)
    argv = cmd(PY, STEP, "--shape", s, "--skip-rlcore", "--timeout", "280", "--out", f"{ctx.res}/grpo_step")
    return [FreeGpu(), Run(f"grpo-raw-{s}", 300, argv)]


def _copy_profile(src: str, dest: str):
    return Do(
        f"copy {src} to {dest}",
        lambda ctx: shutil.copytree(src, dest, dirs_exist_ok=True) if Path(src).is_dir() else None,
    )


def _step_rlcore(ctx: Ctx) -> list:
    s = _shape(ctx)
    argv = cmd(
        PY, STEP, "--shape", s, "--skip-raw", "--steps", "5", "--profile-step", "5", "--timeout", "560"
    )
    argv += ("--out", f"{ctx.res}/grpo_step", *_overrides(ctx))
    return [
        FreeGpu(),
        Run(f"grpo-rlcore-{s}", 580, argv),
        _copy_profile(f"{ctx.res}/grpo_step/runs/grpo_step/profile", f"{ctx.res}/profile"),
    ]


def _step_named(ctx: Ctx) -> list:
    """One named rlcore run beside the others; its JSON carries the bound of this machine's step-raw run."""
    s, name = _shape(ctx), ctx.require("NAME", "the run's name")
    steps = ctx.knob("STEPS", "5")
    profile, limit = ctx.knob("PROFILE", steps), int(ctx.knob("LIMIT", "570"))
    out = f"{ctx.res}/grpo_step"

    def seed_bound(ctx: Ctx) -> None:
        raw, named = Path(out, "raw_generate.json"), Path(out, f"{name}_{s}.json")
        if raw.is_file() and not named.is_file():
            named.write_text(json.dumps({"raw_generate": json.loads(raw.read_text())}))

    def flatten(ctx: Ctx) -> None:  # flat copies of the run's log tails and profile tables
        run = Path(out, "runs", name)
        _copy_log_tails(ctx, out, name)
        prof = Path(ctx.res, f"profile-{name}")
        prof.mkdir(parents=True, exist_ok=True)
        for f in run.glob("profile/*/*.txt"):
            shutil.copyfile(f, prof / f"{f.parent.name}-{f.name}")

    argv = cmd(PY, STEP, "--shape", s, "--skip-raw", "--steps", steps, "--profile-step", profile)
    argv += ("--timeout", str(limit - 15), "--name", name, "--out", out, *_overrides(ctx))
    return [
        FreeGpu(),
        Do(f"seed {out}/{name}_{s}.json with this machine's raw_generate.json (the bound)", seed_bound),
        Run(f"grpo-{name}-{s}", limit, argv),
        Do(f"copy the run's log tails and profile tables into logs-{name}/, profile-{name}/", flatten),
    ]


#: The best tuned settings found (round 4/5's fast path, as round 4's ``tuned`` run passed them): what
#: ``--defaults`` runs are compared against.
TUNED = (*FAST_PATH, "rollout.gpu_memory_utilization=0.3")
#: An H200 with this much held by another process leaves an H100's 79.6 GiB (torch's count of both).
HOLD_FOR_80GB = "60.2"


def _defaults_vs_tuned(ctx: Ctx) -> list:
    """Issue 35's ``grpo-step-defaults-vs-tuned-1gpu``: a short warm-up run whose times are not paired, then
    ``rlcore train`` at its defaults (the workload alone, a run of the default 30 steps timed on its first
    STEPS) against the tuned fast path, then both again in the other order (the re-run). The defaults on an
    80 GB card's memory (HOLD_FOR_80GB GiB held by another process; vLLM's share scaled so it takes what 0.5
    of an 80 GB card is) run when RUNS names ``defaults-80gb``.

    Why the warm-up: on 2026-11-29 the first run on a fresh machine was 28% slower in steps 2-4, in every
    phase, whichever arm it was (defaults 16.32 s, tuned 16.25 s, against 12.07-12.96 s for the runs after
    it), so a pair whose first member is the machine's first run measures the machine, not the settings."""
    s, steps = _shape(ctx), ctx.knob("STEPS", "4")
    out = f"{ctx.res}/grpo_step"
    base = cmd(PY, STEP, "--shape", s, "--skip-raw", "--total-steps", "30", "--out", out)
    kinds = {
        "defaults": ("--defaults",),
        "tuned": TUNED,
        "defaults-80gb": ("--defaults", "--hold-gib", HOLD_FOR_80GB, "rollout.gpu_memory_utilization=0.28"),
        "warmup": TUNED,
    }
    # RUNS: names to run in order, each named after its kind (defaults-run3, tuned-run3, ...).
    names = ctx.knob("RUNS", "warmup defaults tuned tuned-rerun defaults-rerun").split()
    actions: list = []
    for name in names:
        kind = "defaults-80gb" if name.startswith("defaults-80gb") else name.split("-")[0]
        timed = "2" if kind == "warmup" else steps  # the warm-up's times are not used
        argv = base + ("--steps", timed, "--timeout", "400", "--name", name, *kinds[kind], *_overrides(ctx))
        actions += [
            FreeGpu(),
            Run(f"grpo-{name}-{s}", 420, argv),
            Do(
                f"copy the run's driver and first train ranks' logs into logs-{name}/ (what each auto became)",
                lambda ctx, name=name: _copy_log_tails(ctx, out, name, ("driver", "actor-0", "reference-0")),
            ),
        ]
    return actions


def _copy_log_tails(ctx: Ctx, out: str, name: str, only: tuple[str, ...] | None = None) -> None:
    """The last 200 kB of run ``name``'s ``logs/*.log`` (those named in ``only``, else all), flat in
    ``<res>/logs-<name>/``."""
    logs = Path(ctx.res, f"logs-{name}")
    logs.mkdir(parents=True, exist_ok=True)
    for f in Path(out, "runs", name, "logs").glob("*.log"):
        if only is None or f.stem in only:
            (logs / f.name).write_bytes(f.read_bytes()[-200_000:])


def _step_again(ctx: Ctx) -> list:
    s = _shape(ctx)
    base = (PY, STEP, "--shape", s, "--steps", "4")
    actions: list = [
        FreeGpu(),
        Run(
            f"grpo-step-again-{s}",
            300,
            base
            + (
                "--timeout",
                "280",
                "--skip-raw",
                "--name",
                "again",
                "--out",
                f"{ctx.res}/grpo_step",
                *_overrides(ctx),
            ),
        ),
    ]
    variant = ctx.knob("VARIANT", "").split()
    if variant:
        name, extra = variant[0], variant[1:]
        argv = base + (
            "--timeout",
            "260",
            "--skip-raw",
            "--name",
            name,
            "--out",
            f"{ctx.res}/grpo_step",
            *extra,
        )
        actions += [FreeGpu(), Run(f"grpo-step-{name}-{s}", 280, argv)]
    return actions


def _inputs(ctx: Ctx) -> list:
    """The model folder and prompt file alone (what verl reads)."""
    argv = cmd(
        PY, STEP, "--shape", _shape(ctx), "--skip-raw", "--skip-rlcore", "--out", f"{ctx.res}/grpo_step"
    )
    return [Run("inputs", 120, argv)]


def _compare(ctx: Ctx) -> list:
    argv = cmd(
        PY,
        STEP,
        "--shape",
        _shape(ctx),
        "--skip-raw",
        "--skip-rlcore",
        "--out",
        f"{ctx.res}/grpo_step",
        "--verl",
        f"{ctx.res}/verl",
    )
    return [Run("compare", 120, argv)]


def _verl_argv(ctx: Ctx, steps: str, timeout: str) -> tuple[str, ...]:
    s = _shape(ctx)
    return cmd(
        PY,
        "benchmarks/verl_grpo_step.py",
        "--model",
        f"{ctx.res}/grpo_step/qwen2-{s}",
        "--shape",
        s,
        "--prompts-file",
        f"{ctx.res}/grpo_step/prompts.jsonl",
        "--work",
        "/tmp/verl_work",
        "--steps",
        steps,
        "--timeout",
        timeout,
        "--out",
        f"{ctx.res}/verl",
    )


def _smi_start(ctx: Ctx) -> None:
    """GPU memory every 500 ms while verl runs (verl reports none of its own)."""
    Path(ctx.res, "verl").mkdir(parents=True, exist_ok=True)
    with Path(ctx.res, "verl", "gpu_memory.csv").open("w") as f:
        smi = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-lms", "500"],
            stdout=f,
        )
    Path(ctx.res, "verl", "smi.pid").write_text(str(smi.pid))


def _smi_stop(ctx: Ctx) -> None:
    try:
        os.kill(int(Path(ctx.res, "verl", "smi.pid").read_text()), signal.SIGTERM)
    except (OSError, ValueError):
        pass


def _verl_log_excerpts(ctx: Ctx) -> None:
    """verl's log is too long to bring back: its tail, and its head without warnings and progress lines."""
    log = Path(ctx.res, "verl", "verl.log")
    if not log.is_file():
        return
    text = log.read_text(errors="replace")
    Path(ctx.res, "verl", "verl_log_tail.txt").write_text(text[-200_000:])
    keep = [x for x in text.splitlines() if "warn" not in x.lower() and not re.match(r"^\[[ 0-9.]*s\] *$", x)]
    Path(ctx.res, "verl", "verl_log_head.txt").write_text("\n".join(keep)[:400_000])


def _verl(foreground_default_steps: str, foreground_default_timeout: str):
    def build(ctx: Ctx) -> list:
        steps = ctx.knob("VERL_STEPS", foreground_default_steps)
        limit = int(ctx.knob("VERL_TIMEOUT", foreground_default_timeout))
        return [
            FreeGpu(),
            Do("nvidia-smi memory every 500 ms into verl/gpu_memory.csv", _smi_start),
            Run(f"verl-{_shape(ctx)}", limit + 60, _verl_argv(ctx, steps, str(limit)), path=VERL_PATH),
            Do(
                "stop nvidia-smi; verl.log's head and tail into verl/",
                lambda ctx: (_smi_stop(ctx), _verl_log_excerpts(ctx)),
            ),
        ]

    return build


def _verl_bg(ctx: Ctx) -> list:
    """verl outlives one call: started detached, awaited by wait-verl."""
    argv = _verl_argv(ctx, ctx.knob("VERL_STEPS", "3"), "1500")

    def start(ctx: Ctx) -> None:
        env = dict(
            os.environ,
            PYTHONPATH=":".join(VERL_PATH),
            TOKENIZERS_PARALLELISM="false",
            VLLM_USE_FLASHINFER_SAMPLER="0",
        )
        with Path(ctx.res, "verl-bg.log").open("w") as log:
            proc = subprocess.Popen(
                ["nohup", *argv], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        Path(ctx.res, "verl", "pid").write_text(str(proc.pid))
        print(f"verl started: {proc.pid}", flush=True)

    return [
        FreeGpu(),
        Do("nvidia-smi memory into verl/gpu_memory.csv", _smi_start),
        Do(f"detached: PYTHONPATH={':'.join(VERL_PATH)} {' '.join(argv)}", start),
    ]


def _wait_verl(ctx: Ctx) -> list:
    def wait(ctx: Ctx) -> None:
        pid = int(Path(ctx.res, "verl", "pid").read_text())
        deadline = time.time() + float(ctx.knob("WAIT", "570"))
        while time.time() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(1)
        if Path(f"/proc/{pid}").exists():
            steps = (
                Path(ctx.res, "verl", "verl.log").read_text(errors="replace").count("step:")
                if Path(ctx.res, "verl", "verl.log").is_file()
                else 0
            )
            print(f"verl still running ({steps} step lines)", flush=True)
        else:
            _smi_stop(ctx)
            _verl_log_excerpts(ctx)
            print(
                "verl done\n"
                + "\n".join(Path(ctx.res, "verl-bg.log").read_text(errors="replace").splitlines()[-30:]),
                flush=True,
            )

    return [Do("wait up to WAIT (570) s for the detached verl run", wait)]


def _stage(name, doc, seconds, build, bundles=("vllm",), script=STEP):
    return Stage(name, doc, script, seconds, build, bundles)


STAGES = [
    _stage(
        "step",
        "grpo_step_gpu.py: raw vLLM bound run, then rlcore train (4 steps); did not fit 560 s at 0.5B",
        560,
        _step,
    ),
    _stage(
        "step-raw",
        "grpo_step_gpu.py --skip-rlcore: the bound's raw vLLM run alone (writes the model and prompts)",
        240,
        _step_raw,
    ),
    _stage(
        "step-rlcore",
        "grpo_step_gpu.py --skip-raw: rlcore train alone, 5 steps, the last one profiled",
        480,
        _step_rlcore,
    ),
    _stage(
        "step-named",
        "one named rlcore run (NAME, STEPS, PROFILE, LIMIT, STEP_OVERRIDES) with this machine's bound",
        400,
        _step_named,
    ),
    _stage("step-again", "the rlcore run again (its reproduction), and VARIANT beside it", 300, _step_again),
    _stage(
        "step-defaults-vs-tuned",
        "a warm-up run, then rlcore train at its defaults (the workload alone) against the tuned fast path, and "
        "both again in the other order (issue 35's grpo-step-defaults-vs-tuned-1gpu); RUNS=defaults-80gb: the "
        "defaults within an 80 GB card's memory",
        900,
        _defaults_vs_tuned,
    ),
    _stage("step-inputs", "the model folder and prompt file alone (what verl reads)", 60, _inputs),
    _stage("step-compare", "rlcore's and verl's steps into one JSON and table", 30, _compare),
    _stage(
        "verl",
        "verl_grpo_step.py in the foreground: VERL_STEPS (4), VERL_TIMEOUT (520 s)",
        600,
        _verl("4", "520"),
        ("verl", "vllm"),
        "benchmarks/verl_grpo_step.py",
    ),
    _stage(
        "verl-fg",
        "the same as a chain's stage: VERL_STEPS (2), VERL_TIMEOUT (900 s)",
        750,
        _verl("2", "900"),
        ("verl", "vllm"),
        "benchmarks/verl_grpo_step.py",
    ),
    _stage(
        "verl-bg",
        "verl_grpo_step.py detached (VERL_STEPS, 3): awaited by wait-verl",
        10,
        _verl_bg,
        ("verl", "vllm"),
        "benchmarks/verl_grpo_step.py",
    ),
    _stage(
        "wait-verl",
        "wait up to WAIT (570) s for verl-bg",
        570,
        _wait_verl,
        ("verl", "vllm"),
        "benchmarks/verl_grpo_step.py",
    ),
]

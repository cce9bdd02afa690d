"""Synchronous against overlapping training (issue 34): ``benchmarks/async_gpu.py`` on 4 GPUs, one rlcore
run per configuration, one after another on the same machine (the vLLM bundle).

Knobs, as environment variables: CONFIGS (the configurations, in order; default colocated-sync
one-step-off split-sync async), STEPS (5), STEADY_FROM (3), ROLLOUT_GPUS (2), ASYNC_OVERRIDES (more
rlcore key=value for every run).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..actions import PY, Ctx, Do, FreeGpu, Run, cmd
from .base import Stage

SCRIPT = "benchmarks/async_gpu.py"
ORDER = "colocated-sync one-step-off split-sync async"
#: Each run's limit: start-up (Ray, vLLM with CUDA graphs, FSDP) about 80 s, then 5 steps.
LIMITS = {"0.5B": 330, "1.5B": 450}


def _runs(shape: str, repeat: int):
    def build(ctx: Ctx) -> list:
        out = f"{ctx.res}/async"
        limit = LIMITS[shape]
        actions: list = []
        for config in ctx.knob("CONFIGS", ORDER).split():
            argv = cmd(
                PY,
                SCRIPT,
                "--shape",
                shape,
                "--config",
                config,
                "--repeat",
                repeat,
                "--steps",
                ctx.knob("STEPS", "5"),
                "--steady-from",
                ctx.knob("STEADY_FROM", "3"),
                "--rollout-gpus",
                ctx.knob("ROLLOUT_GPUS", "2"),
                "--timeout",
                limit - 15,
                "--out",
                out,
                ctx.knob("ASYNC_OVERRIDES", "").split(),
            )
            suffix = "" if repeat == 1 else f"-r{repeat}"
            actions += [FreeGpu(), Run(f"async-{config}{suffix}-{shape}", limit, argv, tail=45)]
        actions.append(Do(f"print the comparison in {out}/comparison_{shape}.json", _print(out, shape)))
        return actions

    return build


def _print(out: str, shape: str):
    def show(ctx: Ctx) -> None:
        path = Path(out, f"comparison_{shape}.json")
        if path.is_file():
            print(json.dumps(json.loads(path.read_text())["comparison"], indent=1), flush=True)

    return show


def _stage(name: str, doc: str, seconds: int, build) -> Stage:
    return Stage(name, doc, SCRIPT, seconds, build, ("vllm",), gpus=4)


STAGES = [
    _stage(
        "async-0.5b",
        "async_gpu.py at 0.5B on 4 GPUs: colocated sync, 2+2 one-step-off, 2+2 sync, 2+2 async (CONFIGS)",
        760,
        _runs("0.5B", 1),
    ),
    _stage("async-0.5b-again", "the same runs again (their independent repeats, -r2)", 700, _runs("0.5B", 2)),
    _stage("async-1.5b", "async_gpu.py at 1.5B on 4 GPUs, the same configurations", 1000, _runs("1.5B", 1)),
    _stage("async-1.5b-again", "the 1.5B runs again (-r2)", 950, _runs("1.5B", 2)),
]

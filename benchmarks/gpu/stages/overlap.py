"""Synchronous against overlapping training (issue 34): ``benchmarks/async_gpu.py`` on 4 GPUs, one rlcore
run per configuration, one after another on the same machine (the vLLM bundle); and synchronous against
streaming training on ONE GPU (``stream-vs-sync-1gpu``, ``stream-vs-sync-1gpu-1.5b``: ``trainer.mode=stream``
against ``trainer.mode=sync``, both colocated, both at rlcore's defaults but for the mode).

Knobs, as environment variables: CONFIGS (the configurations, in order; default colocated-sync
one-step-off split-sync async), STEPS (5), STEADY_FROM (3), ROLLOUT_GPUS (2), ASYNC_OVERRIDES (more
rlcore key=value for every run). The stream stages: STEPS (3), STEADY_FROM (2), PROMPTS (per shape, see
``STREAM``), MAX_RESPONSE (8192), STREAM_LIMITS (each run's seconds, in order), STREAM_OVERRIDES (more
rlcore key=value for every run: the rows take none).
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


# -- streaming against synchronous on one GPU -----------------------------------------------------------
#
# The rows colocated-stream-vs-sync-throughput-{0.5b,1.5b}-1gpu: trained tokens per second of
# ``trainer.mode=stream`` over ``trainer.mode=sync``, both colocated on one H200, on the long tail (the stop
# strings' geometric lengths, mean ~684, capped at 8192), with nothing but the workload, the placement and
# the mode on the command line (``--defaults``: neither TUNED nor grpo_step_gpu.SETTINGS nor a memory
# share: "at the defaults except the mode").
#
# Order: stream, sync, sync (re-run), stream (re-run), interleaved (ABBA), so a drift over the call lands
# on both; the machine's first run (sometimes slower on a fresh machine, README) is a stream run, so that
# bias can only count against the stream; the report also gives each pair's own ratio (run k against run k)
# beside the medians.
#
# Why so few prompts and steps: everything must finish inside one device call (600 s), collected, on a
# fresh machine: unpacking the vLLM bundle and installing the project take ~70 s, and each run starts Ray,
# vLLM (~60 s with its compile and CUDA graphs; more on the first, cold run, which also writes the model)
# and the FSDP actor and reference before its first step: ~25-50 s of steps are left a run. A
# synchronous step waits for its longest response: of 64 (8 prompts x 8) that is ~3,240 tokens on average
# (``expected_lengths``), ~10-15 s of decoding at 0.5B whatever the batch, so 8 prompts a step give three
# steps (the first a warm-up, steps 2-3 timed) where 128 would give one. At 1.5B each step and start-up
# take longer: 4 prompts (the longest of 32: ~2,780 tokens). ``--steps 3 --total-steps 5``: the run is
# stopped after its third step (no end-of-run checkpoint, no last step that drains the stream), and stays
# under 20 steps, where ``fsdp.compile``'s auto would compile inside the timed steps.
#
# Each run's limit (STREAM_LIMITS overrides, in the run order): they add up to what the call has left, so
# a run that hangs (vLLM once in three cold starts) is ended and the call still comes back with the
# others; a run cut by its limit counts from the steps it logged (``--report --partial``). 0.5B on a fresh
# machine, at worst: ~70 s unpack and install + 470 s of runs + 4 x ~4 s freeing the GPU + the report
# (limit 30, ~5 s) = ~560-590 s of the call's 600. 1.5B, warm: 535 s of runs + ~20 s. Expected: runs end
# at their third step, well before their limits (``seconds``).
STREAM_ORDER = (
    ("colocated-stream", 1),
    ("colocated-sync", 1),
    ("colocated-sync", 2),
    ("colocated-stream", 2),
)
STREAM = {
    # the first run is cold (compile caches, the model written); the stream's steps are shorter
    "0.5B": {"prompts": "8", "limits": (170, 140, 130, 110), "seconds": 560},
    # run right after the 0.5B stage on the same machine (plan --warm): nothing to unpack or install
    "1.5B": {"prompts": "4", "limits": (150, 135, 135, 115), "seconds": 500},
}
STREAM_RES = "stream"


def _stream_runs(shape: str):
    def build(ctx: Ctx) -> list:
        out = f"{ctx.res}/{STREAM_RES}"
        spec = STREAM[shape]
        limits = [int(x) for x in ctx.knob("STREAM_LIMITS", " ".join(map(str, spec["limits"]))).split()]
        if len(limits) != len(STREAM_ORDER):
            raise SystemExit(f"STREAM_LIMITS needs {len(STREAM_ORDER)} numbers, got {limits}")
        steady = ctx.knob("STEADY_FROM", "2")
        actions: list = []
        for (config, repeat), limit in zip(STREAM_ORDER, limits, strict=True):
            argv = cmd(
                PY,
                SCRIPT,
                "--shape",
                shape,
                "--config",
                config,
                "--repeat",
                repeat,
                "--gpus",
                1,
                "--defaults",
                "--prompts",
                ctx.knob("PROMPTS", spec["prompts"]),
                "--max-response",
                ctx.knob("MAX_RESPONSE", "8192"),
                "--steps",
                ctx.knob("STEPS", "3"),
                "--total-steps",
                int(ctx.knob("STEPS", "3")) + 2,
                "--steady-from",
                steady,
                # room inside the harness's limit to stop, kill and write the run's JSON
                "--timeout",
                limit - 10,
                "--out",
                out,
                ctx.knob("STREAM_OVERRIDES", "").split(),
            )
            suffix = "" if repeat == 1 else f"-r{repeat}"
            actions += [FreeGpu(), Run(f"stream-{config}{suffix}-{shape}", limit, argv, tail=45)]
        # Every run, those cut by their limit too (from their logged steps): comparison_<shape>_partial.json
        report = cmd(
            PY, SCRIPT, "--report", "--partial", "--steady-from", steady, "--shape", shape, "--out", out
        )
        actions.append(Run(f"stream-report-{shape}", 30, report, tail=5))
        actions.append(
            Do(
                f"print the comparison in {out}/comparison_{shape}_partial.json",
                _print(out, f"{shape}_partial"),
            )
        )
        return actions

    return build


def _stream_stage(name: str, doc: str, shape: str) -> Stage:
    # h200: the limits are an H200's (the only kind lent now); one GPU
    return Stage(name, doc, SCRIPT, STREAM[shape]["seconds"], _stream_runs(shape), ("vllm",), h200=True)


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
    _stream_stage(
        "stream-vs-sync-1gpu",
        "async_gpu.py at 0.5B on one GPU, colocated, at the defaults but the mode: sync, stream, stream, "
        "sync (8 prompts x 8 a step, up to 8192 tokens, 3 steps), then the report "
        "(colocated-stream-vs-sync-throughput-0.5b-1gpu)",
        "0.5B",
    ),
    _stream_stage(
        "stream-vs-sync-1gpu-1.5b",
        "the same at 1.5B (4 prompts x 8 a step), on the machine the 0.5B stage set up (plan --warm) "
        "(colocated-stream-vs-sync-throughput-1.5b-1gpu)",
        "1.5B",
    ),
]

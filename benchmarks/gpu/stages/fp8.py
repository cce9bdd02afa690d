"""FP8 rollout (issue 53): throughput against bf16 on a 1.5B-shaped model, and the SmolLM2 recipe with it.

``benchmarks/fp8_rollout_gpu.py`` runs one engine plugin per process, bf16 then fp8 (engines of their
own, one after the other); the recipe runs are ``smollm2-task-*`` stages (:mod:`.models`) with
``rollout.quantization=fp8``.
"""

from __future__ import annotations

from ..actions import PY, Ctx, FreeGpu, Run, cmd
from .base import Stage
from .models import _stage as _recipe


def _throughput(engine: str, out: str):
    def build(ctx: Ctx) -> list:
        argv = cmd(
            PY,
            "benchmarks/fp8_rollout_gpu.py",
            "--engine",
            engine,
            "--repeats",
            # 3 calls an engine let one slow bf16 call move the ratio by 0.1 (2026-12-03): 5.
            "5",
            "--out",
            f"{ctx.res}/{out}",
        )
        return [Run(out.removesuffix(".json"), 500, argv, tail=30), FreeGpu()]

    return build


def _stage(name: str, engine: str, out: str, doc: str) -> Stage:
    return Stage(name, doc, "benchmarks/fp8_rollout_gpu.py", 240, _throughput(engine, out), bundles=(engine,))


STAGES = [
    _stage(
        "fp8-tok-s-vllm",
        "vllm",
        "fp8_vllm.json",
        "vLLM, 1.5B shape, batch 256 x 512 new tokens: bf16 then fp8",
    ),
    _stage("fp8-tok-s-vllm-rerun", "vllm", "fp8_vllm_rerun.json", "its re-run, in a process of its own"),
    _stage("fp8-tok-s-sglang", "sglang", "fp8_sglang.json", "SGLang, the same: bf16 then fp8"),
    _stage(
        "fp8-tok-s-sglang-rerun", "sglang", "fp8_sglang_rerun.json", "its re-run, in a process of its own"
    ),
    _recipe(
        "fp8",
        "the addition recipe with FP8 rollout (vLLM): rollout.quantization=fp8",
        "rollout.quantization=fp8",
    ),
    _recipe("fp8-rerun", "its re-run with trainer.seed=1", "rollout.quantization=fp8 trainer.seed=1"),
    _recipe(
        "sglang-fp8",
        "the addition recipe with FP8 rollout through SGLang",
        "rollout.engine=sglang rollout.quantization=fp8",
        "sglang",
    ),
    _recipe(
        "sglang-fp8-rerun",
        "its re-run with trainer.seed=1",
        "rollout.engine=sglang rollout.quantization=fp8 trainer.seed=1",
        "sglang",
    ),
]

"""Vision-language RL on one GPU (issue 54): the rollout engines' image tests, the visual recipe
(``builtin:count_shapes`` on the tiny Qwen2.5-VL) through vLLM and SGLang, and a GRPO step of a
Qwen2.5-VL-3B-shaped model (``benchmarks/vlm_step_gpu.py``). Each row has a ``-rerun`` stage
(``trainer.seed=1``)."""

from __future__ import annotations

import shutil
from pathlib import Path

from ..actions import PY, Ctx, Do, FreeGpu, Run, words
from .base import Stage
from .models import RLCORE

#: The documented command's recipe, as on the CPU: its own defaults (20 SFT warm-up steps, 80 GRPO steps).
RECIPE_RESULTS = "benchmarks/results/count-shapes-gpu"


def _pytest(name: str, target: str, limit: int):
    def build(ctx: Ctx) -> list:
        argv = (PY, "-m", "pytest", target, "-v", "-s", "-rA", f"--junitxml={ctx.res}/{name}.xml")
        return [FreeGpu(), Run(name, limit, argv, tail=40)]

    return build


def _recipe(name: str, overrides: str):
    def build(ctx: Ctx) -> list:
        def keep(ctx: Ctx) -> None:
            for suffix in (".json", ".png", "-metrics.jsonl"):
                src = Path(RECIPE_RESULTS) / f"{name}{suffix}"
                if src.is_file():
                    shutil.copyfile(src, Path(ctx.res) / src.name)

        argv = (
            PY,
            "benchmarks/smollm2_task_cpu.py",
            "--task",
            "count_shapes",
            "--name",
            name,
            "--row",
            f"count-shapes-gpu-{name}",
            "--results",
            RECIPE_RESULTS,
            "--rlcore",
            RLCORE,
            *words(overrides),
        )
        return [
            FreeGpu(),
            Run(f"count-shapes-{name}", 400, argv, tail=30),
            Do(f"copy {name} results into RES", keep),
        ]

    return build


def _step(name: str, rollout: str, overrides: str = ""):
    def build(ctx: Ctx) -> list:
        argv = (
            PY,
            "benchmarks/vlm_step_gpu.py",
            "--rollout",
            rollout,
            "--name",
            name,
            "--out",
            f"{ctx.res}/vlm_step",
            *words(overrides),
        )
        return [FreeGpu(), Run(f"vlm-step-{name}", 480, argv, tail=30)]

    return build


STAGES = [
    Stage(
        "vision-tests-sglang",
        "plugins/sglang/tests/test_vision_gpu.py: SGLang's image log-probs against float64 transformers, "
        "before and after a vision-tower sync (tiny Qwen2.5-VL and Qwen3-VL)",
        "plugins/sglang/tests/test_vision_gpu.py",
        150,
        _pytest("vision-tests-sglang", "plugins/sglang/tests/test_vision_gpu.py", 300),
        ("sglang",),
    ),
    Stage(
        "vision-tests-vllm",
        "plugins/vllm/tests/test_vision_gpu.py: the same check on vLLM's GPU build",
        "plugins/vllm/tests/test_vision_gpu.py",
        120,
        _pytest("vision-tests-vllm", "plugins/vllm/tests/test_vision_gpu.py", 300),
        ("vllm",),
    ),
]
for _rollout in ("vllm", "sglang"):
    STAGES += [
        Stage(
            f"count-shapes-{_rollout}",
            f"the visual recipe on one GPU: rlcore train --engine fsdp --rollout {_rollout} "
            "data.train_files=[builtin:count_shapes/train.jsonl] (its defaults)",
            "benchmarks/smollm2_task_cpu.py",
            200,
            _recipe(_rollout, f"rollout.engine={_rollout}"),
            (_rollout,),
        ),
        Stage(
            f"count-shapes-{_rollout}-rerun",
            f"the visual recipe through {_rollout} again, trainer.seed=1",
            "benchmarks/smollm2_task_cpu.py",
            200,
            _recipe(f"{_rollout}-rerun", f"rollout.engine={_rollout} trainer.seed=1"),
            (_rollout,),
        ),
        Stage(
            f"vlm-step-3b-{_rollout}",
            f"vlm-grpo-step-3b-1gpu: 4 GRPO steps of a Qwen2.5-VL-3B-shaped model (random) with {_rollout}",
            "benchmarks/vlm_step_gpu.py",
            240,
            _step(_rollout, _rollout),
            (_rollout,),
        ),
        Stage(
            f"vlm-step-3b-{_rollout}-rerun",
            f"vlm-grpo-step-3b-1gpu with {_rollout} again, trainer.seed=1",
            "benchmarks/vlm_step_gpu.py",
            240,
            _step(f"{_rollout}-rerun", _rollout, "trainer.seed=1"),
            (_rollout,),
        ),
    ]

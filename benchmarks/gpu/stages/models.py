"""Runs on the one real pretrained model (issue 37): the addition recipe on SmolLM2-135M-Instruct.

The model comes from the ``smollm2`` bundle (the registry package's GGUF file), dequantized on the machine
by ``builtin:smollm2-135m-instruct`` as it is here; vLLM from the ``vllm`` bundle. ``benchmarks/smollm2_task_cpu.py``
runs ``rlcore train`` and reports held-out accuracy before and after, as on the CPU.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..actions import PY, Ctx, Do, Run, words
from .base import Stage

# `rlcore` without its console script (pip --target puts it in /tmp/proj/bin, off PATH).
RLCORE = f"{PY} -c 'import sys; from rlcore.cli.main import main; sys.exit(main())'"
#: The GPU recipe: the CPU recipe's model, task, algorithm and sampling, with a larger batch and more
#: steps (64 problems x 8 samples, 30 steps, validation every 5).
GPU_RECIPE = "data.train_batch_size=64 trainer.total_steps=30 trainer.val_freq=5"


def _task(name: str, overrides: str):
    def build(ctx: Ctx) -> list:
        results = Path(ctx.res)

        def keep(ctx: Ctx) -> None:
            for suffix in ("json", "png"):
                src = Path("benchmarks/results/smollm2-task-gpu") / f"{name}.{suffix}"
                if src.is_file():
                    shutil.copyfile(src, results / src.name)

        argv = (
            PY,
            "benchmarks/smollm2_task_cpu.py",
            "--name",
            name,
            "--row",
            f"smollm2-task-accuracy-h100-{name}",
            "--results",
            "benchmarks/results/smollm2-task-gpu",
            "--rlcore",
            RLCORE,
            *words(f"{GPU_RECIPE} {overrides}"),
        )
        return [Run(f"smollm2-{name}", 540, argv, tail=30), Do(f"copy {name}.json/.png into RES", keep)]

    return build


def _stage(name: str, doc: str, overrides: str = "", rollout: str = "vllm") -> Stage:
    return Stage(
        f"smollm2-task-{name}",
        doc,
        "benchmarks/smollm2_task_cpu.py",
        400,
        _task(name, overrides),
        bundles=(rollout, "smollm2"),
    )


#: The documented LoRA recipe (docs/quickstart.md), in bf16: vLLM's GPU LoRA kernels take no fp32.
LORA = "actor.lora.rank=16 actor.lora.alpha=32 actor.optim.lr=2e-4 model.dtype=bfloat16"


STAGES = [
    _stage("full", f"the addition recipe on one GPU, full fine-tuning: {GPU_RECIPE}"),
    _stage("full-rerun", "its re-run with trainer.seed=1", "trainer.seed=1"),
    _stage(
        "lora",
        "the same with a rank-16 LoRA adapter, in bf16 (vLLM's GPU LoRA kernels take no fp32): the adapter-only sync",
        LORA,
    ),
    # Issue 53: the post-sync check at its defaults on the SGLang pairs, LoRA loaded as an adapter by
    # SGLang against merged into bf16 weights (the gap row reads rollout/logprob_diff_mean of both).
    _stage(
        "sglang-full",
        "FSDP + SGLang, full fine-tuning, the check's defaults",
        "rollout.engine=sglang",
        "sglang",
    ),
    _stage(
        "sglang-full-rerun",
        "its re-run with trainer.seed=1",
        "rollout.engine=sglang trainer.seed=1",
        "sglang",
    ),
    _stage(
        "sglang-lora",
        "FSDP + SGLang, the LoRA recipe, the adapter loaded by SGLang",
        f"rollout.engine=sglang {LORA}",
        "sglang",
    ),
    _stage(
        "sglang-lora-rerun",
        "its re-run with trainer.seed=1",
        f"rollout.engine=sglang {LORA} trainer.seed=1",
        "sglang",
    ),
    _stage(
        "sglang-lora-merged",
        "FSDP + SGLang, the LoRA recipe with merged weights (actor.lora.sync=merged): the gap row's other side",
        f"rollout.engine=sglang {LORA} actor.lora.sync=merged",
        "sglang",
    ),
]


# Issue 57: one installation serves both rollout plugins. The driver (Megatron trainer, the machine's
# transformers 5.17) reads the vLLM bundle's site, never the SGLang bundle's; SGLang's workers start in
# the environment `sglang` (rlcore.envs), which reads the SGLang bundle's site (SGLang and the
# transformers 5.12.1 it pins) before the driver's folders. The machine has no registry: the bundle's site
# meets the plugin's RLCORE_PLUGIN_ENV (rlcore-sglang[cuda]) and the build runs no pip (--no-index).
ENV_HOME = "/tmp/envs"
SGLANG_SITES = "environments.sites.sglang=[/tmp/site]"
SGLANG_ENV = f"environments.roles.rollout=sglang {SGLANG_SITES}"
#: PYTHONPATH of the driver of the environment stages: the project, the vLLM bundle, the model's GGUF.
ENV_DRIVER_PATH = ("/tmp/proj", "/tmp/vsite", "/tmp/smsite")


def _env_build(ctx: Ctx) -> list:
    main = "import sys; from rlcore.cli.main import main; sys.exit(main())"
    argv = (PY, "-c", main, "env", "build", "sglang", "--no-index", SGLANG_SITES)
    return [Run("env-build-sglang", 120, argv, tail=10)]  # RLCORE_ENV_HOME: the stage's env


def _env_stage(name: str, doc: str, overrides: str, build_env: bool) -> Stage:
    task = _task(name, f"engine=megatron {overrides}")

    def build(ctx: Ctx) -> list:
        return (_env_build(ctx) if build_env else []) + task(ctx)

    return Stage(
        f"smollm2-task-{name}",
        doc,
        "benchmarks/smollm2_task_cpu.py",
        330,
        build,
        bundles=("vllm", "sglang", "smollm2"),
        path=ENV_DRIVER_PATH,
        env_extra={"RLCORE_ENV_HOME": ENV_HOME},
    )


STAGES += [
    _env_stage(
        "megatron-sglang-env",
        "Megatron + SGLang, SGLang's workers in the environment `sglang` (its transformers 5.12.1), the trainer "
        "on the machine's 5.17; builds the environment first",
        f"rollout.engine=sglang {SGLANG_ENV}",
        True,
    ),
    _env_stage(
        "megatron-vllm-same-install",
        "Megatron + vLLM from the same installation (driver environment, the machine's transformers)",
        "rollout.engine=vllm",
        False,
    ),
    _env_stage(
        "megatron-sglang-env-rerun",
        "the SGLang-environment run again with trainer.seed=1",
        f"rollout.engine=sglang {SGLANG_ENV} trainer.seed=1",
        True,
    ),
    _env_stage(
        "megatron-vllm-same-install-rerun",
        "the vLLM run again with trainer.seed=1",
        "rollout.engine=vllm trainer.seed=1",
        False,
    ),
    # Issue 53: LoRA on the Megatron engine (the adapter-only sync into each rollout), the documented recipe.
    _env_stage(
        "megatron-sglang-lora",
        "Megatron + SGLang (its own environment), the LoRA recipe, the adapter loaded by SGLang",
        f"rollout.engine=sglang {SGLANG_ENV} {LORA}",
        True,
    ),
    _env_stage(
        "megatron-vllm-lora",
        "Megatron + vLLM, the LoRA recipe, the adapter loaded by vLLM",
        f"rollout.engine=vllm {LORA}",
        False,
    ),
    _env_stage(
        "megatron-sglang-lora-rerun",
        "its re-run with trainer.seed=1",
        f"rollout.engine=sglang {SGLANG_ENV} {LORA} trainer.seed=1",
        True,
    ),
    _env_stage(
        "megatron-vllm-lora-rerun",
        "its re-run with trainer.seed=1",
        f"rollout.engine=vllm {LORA} trainer.seed=1",
        False,
    ),
]

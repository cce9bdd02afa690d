"""The FSDP rows (issue 5): benchmarks/fsdp_train.py on the machine's own packages (no bundle).

Each stage is one row group of "FSDP training" in docs/benchmarks.md, its arguments as they ran there.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from ..actions import PY, Ctx, Do, FreeGpu, Run, words
from .base import Stage

MODELS = "/tmp/models"
TUNED_1_5B = "--models qwen2.5-1.5b --gpus 1 --systems fsdp-mp-varlen-compile --no-reshard-after-forward --reduce-grads-once-per-step --max-tokens-per-micro-batch 16384"


def bench(ctx: Ctx, name: str, limit: int, args: str, profile: bool = False) -> Run:
    argv = (
        PY,
        "benchmarks/fsdp_train.py",
        "--model-dir",
        MODELS,
        "--out",
        f"{ctx.res}/{name}.json",
        *words(args),
    )
    if profile:
        argv += ("--profile", f"{ctx.res}/profiles")
    return Run(name, limit, argv, show=r"^model|^\|")


#: Ulysses sequence parallelism (issue 36, row fsdp-ulysses-longest-sequence-1.5b-4gpu): the longest single
#: sequence the 1.5B shape trains on 4 GPUs at SP=4 against SP=1, and tokens/s at 32k. The script bounds
#: itself (--deadline-s 235: what was measured by then is written), inside its 260 s limit.
ULYSSES = "benchmarks/ulysses_gpu.py"


def ulysses(ctx: Ctx, name: str) -> list:
    argv = (PY, ULYSSES, *words("--gpus 4 --sp 4 1 --model-dir"), MODELS, "--out", f"{ctx.res}/{name}.json")
    # FreeGpu first: ranks left behind by a run its timeout ended would hold their GPUs' memory.
    return [FreeGpu(), Run(name, 260, argv, show=r"^\||^summary")]


def _pack_profiles(ctx: Ctx) -> None:
    """The profiles travel as one archive (a call brings back few files)."""
    profiles = Path(ctx.res, "profiles")
    if profiles.is_dir():
        subprocess.run(["tar", "-C", ctx.res, "-czf", f"{ctx.res}/profiles.tgz", "profiles"], check=False)
        shutil.rmtree(profiles)


def _stage(name: str, doc: str, seconds: int, runs, gpus: int = 1) -> Stage:
    def build(ctx: Ctx) -> list:
        return [*(bench(ctx, *r) for r in runs), Do("tar profiles/ into profiles.tgz", _pack_profiles)]

    return Stage(f"fsdp-{name}", doc, "benchmarks/fsdp_train.py", seconds, build, gpus=gpus)


_S = "--models qwen2.5-0.5b --gpus 2 --systems fsdp-mp-varlen-compile --no-reshard-after-forward --tokens-per-step 65536 --max-tokens-per-micro-batch 16384 --steps 4 --warmup 3"
_M = f"{TUNED_1_5B} --tokens-per-step 262144 --steps 3 --warmup 2"
_F = "--tokens-per-step 65536 --max-tokens-per-micro-batch 16384 --steps 5 --warmup 3 --no-reshard-after-forward"

#: LoRA against full fine-tuning (issue 37): the 1.5B shape at the FSDP engine's defaults (fp32
#: parameters, bf16 mixed precision as RL runs use, padded micro-batches) and tuned (var-len), each full
#: and with a rank-64 adapter on every linear layer; same workload, one process per run.
_LORA = "--models qwen2.5-1.5b --gpus 1 --tokens-per-step 65536 --max-tokens-per-micro-batch 16384 --steps 5 --warmup 2"
_LORA_RUNS = [
    (f"lora-vs-full-{system}-{label}", 200, f"{_LORA} --systems {system} --lora-rank {rank}")
    for system in ("fsdp-mp", "fsdp-mp-varlen")
    for label, rank in (("full", 0), ("lora64", 64))
]

STAGES = [
    _stage("lora-vs-full-1.5b", "1.5B: full fine-tuning against a rank-64 LoRA adapter", 480, _LORA_RUNS),
    _stage(
        "lora-vs-full-1.5b-again",
        "the re-run of lora-vs-full-1.5b (same machine, fresh processes)",
        480,
        [(name.replace("lora-vs-full", "lora-vs-full-again"), t, a) for name, t, a in _LORA_RUNS],
    ),
    _stage(
        "small",
        "0.5B: naive HF, the engine with mixed precision and var-len, bf16 var-len",
        150,
        [
            (
                "small",
                200,
                "--models qwen2.5-0.5b --gpus 1 --systems hf-naive fsdp-mp-varlen fsdp-bf16-varlen --tokens-per-step 65536 --max-tokens-per-micro-batch 16384 --steps 4 --warmup 2",
                True,
            )
        ],
    ),
    _stage(
        "large",
        "1.5B: the engine's eager var-len beside naive HF",
        200,
        [
            (
                "large",
                280,
                "--models qwen2.5-1.5b --gpus 1 --systems fsdp-mp-varlen hf-naive --tokens-per-step 65536 --max-tokens-per-micro-batch 8192 --steps 4 --warmup 2",
                True,
            )
        ],
    ),
    _stage(
        "compile",
        "the compiled engine on 0.5B and 1.5B",
        400,
        [
            (
                "compile-small",
                200,
                "--models qwen2.5-0.5b --gpus 1 --systems fsdp-mp-varlen-compile hf-naive --tokens-per-step 65536 --max-tokens-per-micro-batch 8192 --steps 4 --warmup 3",
                True,
            ),
            (
                "compile-large",
                300,
                "--models qwen2.5-1.5b --gpus 1 --systems fsdp-mp-varlen-compile --tokens-per-step 65536 --max-tokens-per-micro-batch 16384 --steps 4 --warmup 3",
                True,
            ),
        ],
    ),
    _stage(
        "scaling",
        "1 against 2 GPUs, 0.5B (the session-2 scaling rows)",
        350,
        [
            (
                "scaling",
                430,
                "--models qwen2.5-0.5b --gpus 1 2 --systems fsdp-mp-varlen-compile --reduce-grads-once-per-step --no-reshard-after-forward --tokens-per-step 65536 --max-tokens-per-micro-batch 16384 --steps 5 --warmup 3",
            )
        ],
        gpus=2,
    ),
    _stage(
        "large-steps",
        "1.5B at 128k and 256k tokens per step",
        420,
        [
            (
                "large-128k",
                230,
                f"{TUNED_1_5B} --logits-chunk-size 8192 --steps 4 --warmup 3 --tokens-per-step 131072",
            ),
            (
                "large-256k",
                260,
                f"{TUNED_1_5B} --logits-chunk-size 8192 --steps 4 --warmup 3 --tokens-per-step 262144 --steps 3 --warmup 2",
            ),
        ],
    ),
    _stage(
        "scaling-final",
        "1 against 2 GPUs, 0.5B, logits kept (the latest scaling rows)",
        350,
        [
            (
                "scaling-final",
                430,
                "--models qwen2.5-0.5b --gpus 1 2 --systems fsdp-mp-varlen-compile --reduce-grads-once-per-step --no-reshard-after-forward --tokens-per-step 65536 --max-tokens-per-micro-batch 16384 --logits-chunk-size 4096 --no-recompute-logits --steps 5 --warmup 3",
            )
        ],
        gpus=2,
    ),
    _stage(
        "scaling-why",
        "2 GPUs: gradients reduced once a step, per micro-batch, and the foreach optimizer",
        330,
        [
            ("why-reduce-once", 150, f"{_S} --reduce-grads-once-per-step", True),
            ("why-sync", 120, _S),
            ("why-foreach", 120, f"{_S} --reduce-grads-once-per-step --no-fused-optimizer"),
        ],
        gpus=2,
    ),
    _stage(
        "tuned",
        "naive HF against the session-2 engine, 0.5B and 1.5B",
        450,
        [
            (
                "naive-small",
                120,
                "--models qwen2.5-0.5b --gpus 1 --systems hf-naive --tokens-per-step 65536 --max-tokens-per-micro-batch 8192 --steps 4 --warmup 2",
            ),
            (
                "tuned-small",
                200,
                "--models qwen2.5-0.5b --gpus 1 --systems fsdp-mp-varlen-compile --no-reshard-after-forward --tokens-per-step 65536 --max-tokens-per-micro-batch 16384 --steps 4 --warmup 3",
                True,
            ),
            (
                "tuned-large",
                230,
                "--models qwen2.5-1.5b --gpus 1 --systems fsdp-mp-varlen-compile --no-reshard-after-forward --tokens-per-step 65536 --max-tokens-per-micro-batch 16384 --steps 4 --warmup 3",
                True,
            ),
        ],
    ),
    _stage(
        "final",
        "gradients reduced once a step against per micro-batch, 0.5B and 1.5B at 64k tokens",
        450,
        [
            (
                "final-small",
                170,
                f"--models qwen2.5-0.5b --gpus 1 --systems fsdp-mp-varlen-compile {_F} --reduce-grads-once-per-step",
            ),
            (
                "final-large-sync",
                170,
                f"--models qwen2.5-1.5b --gpus 1 --systems fsdp-mp-varlen-compile {_F}",
            ),
            (
                "final-large",
                200,
                f"--models qwen2.5-1.5b --gpus 1 --systems fsdp-mp-varlen-compile {_F} --reduce-grads-once-per-step",
                True,
            ),
        ],
    ),
    _stage(
        "mfu",
        "1.5B at 256k tokens: first-fit against even micro-batches",
        480,
        [
            ("mfu-first-fit", 280, f"{_M} --logits-chunk-size 8192 --first-fit-micro-batches"),
            ("mfu-balanced", 300, f"{_M} --logits-chunk-size 8192", True),
        ],
    ),
    _stage(
        "mfu-logits",
        "1.5B at 256k tokens with the logits kept, 8k and 4k chunks",
        480,
        [
            ("mfu-kept-logits", 280, f"{_M} --logits-chunk-size 8192 --no-recompute-logits", True),
            ("mfu-kept-logits-4k", 250, f"{_M} --logits-chunk-size 4096 --no-recompute-logits"),
        ],
    ),
    _stage(
        "mfu-final",
        "the headline FSDP rows: 1.5B before / after, 0.5B naive / after",
        480,
        [
            ("final-before", 170, f"{_M} --logits-chunk-size 8192 --first-fit-micro-batches"),
            ("final-after", 170, f"{_M} --logits-chunk-size 4096 --no-recompute-logits", True),
            (
                "final-small-naive",
                90,
                "--models qwen2.5-0.5b --gpus 1 --tokens-per-step 65536 --steps 5 --warmup 3 --systems hf-naive --max-tokens-per-micro-batch 8192",
            ),
            (
                "final-small-after",
                120,
                "--models qwen2.5-0.5b --gpus 1 --tokens-per-step 65536 --steps 5 --warmup 3 --systems fsdp-mp-varlen-compile --no-reshard-after-forward --reduce-grads-once-per-step --max-tokens-per-micro-batch 16384 --logits-chunk-size 4096 --no-recompute-logits",
            ),
        ],
    ),
    Stage(
        "fsdp-ulysses-4gpu",
        "1.5B on 4 x H200: the longest single sequence at SP=4 against SP=1, tokens/s at 32k (run and re-run)",
        ULYSSES,
        500,
        lambda ctx: [*ulysses(ctx, "ulysses-1.5b"), *ulysses(ctx, "ulysses-1.5b-rerun")],
        gpus=4,
        h200=True,
    ),
]

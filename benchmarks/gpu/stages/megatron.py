"""The Megatron rows (issue 17): Megatron beside the FSDP engine on the same workload, on the Megatron bundle.

Runs side by side (pairs, compile-*, seq2-*) each get one GPU and half the host's cores (BENCH_HOST_CPUS,
``_workload.host_threads``). Knobs: EAGER=0 skips the eager Megatron run of seq-*, SKIP_FSDP=1 their FSDP
run, COMPILE=0 runs the TP=2 stages eager. Output file names are the old script's, as megatron_report.py
and the results folders name them.
"""

from __future__ import annotations

from dataclasses import replace

from ..actions import PY, Ctx, Parallel, Run, cmd, words
from .base import Stage

MODELS = "/tmp/rlcore-bench-models"
MEGATRON = words("--remove-padding --logits-chunk-size 4096 --max-tokens-per-micro-batch 16384")
# At TP=1 the head keeps its logits for the backward, as FSDP's setting does. The TP=2 stages before
# tp2-keep-* recompute them (the vocabulary-parallel head could not keep them then).
TP1 = MEGATRON + ("--no-recompute-logits",)
FSDP = words(
    "--systems fsdp-mp-varlen-compile --no-reshard-after-forward --reduce-grads-once-per-step "
    "--max-tokens-per-micro-batch 16384 --logits-chunk-size 4096 --no-recompute-logits"
)
SAVE = (
    "import sys, torch; sys.path.insert(0, 'benchmarks'); from pathlib import Path; "
    "from _workload import save_random_model; Path('{models}').mkdir(parents=True, exist_ok=True); "
    "print(save_random_model('{model}', Path('{models}'), torch.device('cuda')))"
)


def save_model(model: str) -> Run:
    """The random model once, before two processes would both write it."""
    return Run("models", 600, (PY, "-c", SAVE.format(model=model, models=MODELS)), append=True)


def workload(model: str) -> tuple[str, ...]:
    """Per GPU: 0.5B 65,536 tokens a step, 5 timed after 3; 1.5B 262,144, 3 after 2."""
    if model == "qwen2.5-0.5b":
        return words("--tokens-per-step 65536 --steps 5 --warmup 3")
    return words("--tokens-per-step 262144 --steps 3 --warmup 2")


def megatron(
    ctx: Ctx, name: str, limit: int, gpus: int, layouts: str, model: str, *args, env=None, out=None
) -> Run:
    """benchmarks/megatron_gpu.py, its results in ``<res>/<out or name>.json``; shows the layouts' result lines."""
    argv = cmd(
        PY, "benchmarks/megatron_gpu.py", "--gpus", gpus, "--layouts", words(layouts), "--model", model
    )
    argv += cmd("--model-dir", MODELS, *args, "--out", f"{ctx.res}/{out or name}.json")
    return Run(name, limit, argv, env=env or {}, show=f"^({'|'.join(layouts.split())})")


def fsdp(ctx: Ctx, name: str, limit: int, gpus: int, model: str, *args, env=None) -> Run:
    argv = cmd(
        PY, "benchmarks/fsdp_train.py", "--gpus", gpus, "--models", model, *args, "--model-dir", MODELS
    )
    return Run(name, limit, argv + ("--out", f"{ctx.res}/{name}.json"), env=env or {}, tail=3)


def _tp2_compile(ctx: Ctx) -> tuple[str, ...]:
    return () if ctx.knob("COMPILE", "1") == "0" else ("--compile",)


def _one(ctx: Ctx, gpu: str) -> dict[str, str]:
    return {"CUDA_VISIBLE_DEVICES": gpu, "BENCH_HOST_CPUS": ctx.half_cpus}


def _pair(name: str, model: str, tokens: int, steps: int, warmup: int, ga: str, gb: str):
    """Megatron TP=1 on GPU ga, FSDP's tuned setting on GPU gb, at the same time."""

    def build(ctx: Ctx) -> list:
        common = ("--tokens-per-step", tokens, "--steps", steps, "--warmup", warmup)
        m = megatron(
            ctx,
            f"{name}-megatron",
            500,
            1,
            "tp1",
            model,
            TP1,
            common,
            "--profile",
            f"{ctx.res}/profile-{name}",
            env=_one(ctx, ga),
        )
        f = fsdp(ctx, f"{name}-fsdp", 500, 1, model, FSDP, common, env=_one(ctx, gb))
        return [save_model(model), Parallel(((m,), (f,)))]

    return build


def rows(ctx: Ctx, stage: str, model: str, env: dict[str, str] | None = None) -> list:
    """Megatron compiled (profiled), eager (unless EAGER=0), FSDP (profiled, unless SKIP_FSDP=1), one after
    another on the visible GPU."""
    w = workload(model)
    out = [
        megatron(
            ctx,
            f"{stage}-megatron-compile",
            400,
            1,
            "tp1",
            model,
            TP1,
            w,
            "--compile",
            "--profile",
            f"{ctx.res}/profile-{stage}-megatron",
            env=env,
        )
    ]
    if ctx.knob("EAGER", "1") != "0":
        out.append(megatron(ctx, f"{stage}-megatron-eager", 400, 1, "tp1", model, TP1, w, env=env))
    if ctx.knob("SKIP_FSDP", "0") != "1":
        out.append(
            fsdp(
                ctx,
                f"{stage}-fsdp",
                400,
                1,
                model,
                FSDP,
                w,
                "--profile",
                f"{ctx.res}/profile-{stage}-fsdp",
                env=env,
            )
        )
    return out


def _rows(stage: str, model: str):
    return lambda ctx: [save_model(model), *rows(ctx, stage, model)]


def _seq2(size: str, model: str | None = None):
    """seq-* on GPU 0 (the row) and rerun-* on GPU 1 (its independent re-run) at once; ``model``: a shape
    of ``_workload.SHAPES`` other than ``qwen2.5-<size>``."""
    model = model or f"qwen2.5-{size}"
    return lambda ctx: [
        save_model(model),
        Parallel(
            (
                tuple(rows(ctx, f"seq-{size}", model, _one(ctx, "0"))),
                tuple(rows(ctx, f"rerun-{size}", model, _one(ctx, "1"))),
            )
        ),
    ]


def _seq_then_rerun(size: str, model: str):
    """seq-* then rerun-* one after another on one GPU (what ``_seq2`` runs side by side on two), the
    compiled Megatron run and FSDP's tuned one each (the eager run left out)."""

    def build(ctx: Ctx) -> list:
        ctx = replace(ctx, env={**ctx.env, "EAGER": "0"})
        w = workload(model)
        # megatron-core's fused [gate | up] MLP beside it once: what megatron.split_gate_up changed.
        fused = megatron(
            ctx, f"seq-{size}-megatron-fused", 400, 1, "tp1", model, TP1, w, "--compile", "--fused-gate-up"
        )
        return [
            save_model(model),
            *rows(ctx, f"seq-{size}", model),
            fused,
            *rows(ctx, f"rerun-{size}", model),
        ]

    return build


def _compile(size: str):
    model, stage = f"qwen2.5-{size}", f"compile-{size}"

    def build(ctx: Ctx) -> list:
        w = workload(model)
        on = megatron(ctx, f"{stage}-on", 500, 1, "tp1", model, TP1, w, "--compile", env=_one(ctx, "0"))
        off = megatron(ctx, f"{stage}-off", 500, 1, "tp1", model, TP1, w, env=_one(ctx, "1"))
        return [save_model(model), Parallel(((on,), (off,)))]

    return build


def _moe_1gpu(ctx: Ctx) -> list:
    """Qwen3-30B-A3B's layer shape, 4 layers, on one GPU: grouped-GEMM experts (the default), then
    megatron-core's per-expert loop (LOOP=0: not)."""
    model = "qwen3-30b-a3b-4l"
    common = (TP1, words("--tokens-per-step 32768 --steps 2 --warmup 1"))
    runs = [
        megatron(ctx, "moe-1gpu-grouped", 150, 1, "tp1", model, *common, env={"CUDA_VISIBLE_DEVICES": "0"})
    ]
    if ctx.knob("LOOP", "1") != "0":
        runs.append(
            megatron(
                ctx,
                "moe-1gpu-loop",
                120,
                1,
                "tp1",
                model,
                *common,
                "--no-moe-grouped-gemm",
                env={"CUDA_VISIBLE_DEVICES": "0"},
            )
        )
    return [save_model(model), *runs]


def _moe_4gpu(ctx: Ctx) -> list:
    """Qwen3-30B-A3B's layer shape with 8 layers on 4 GPUs: EP=4 (profiled) then EP=1 (every rank all
    experts, the distributed optimizer sharding their state), then both again in fresh processes, the
    other order first (AGAIN=0: not)."""
    model = "qwen3-30b-a3b-8l"
    common = (TP1, words("--tokens-per-step 65536 --steps 3 --warmup 2"))
    runs = [
        megatron(
            ctx, "moe-4gpu-ep4", 400, 4, "ep4", model, *common, "--profile", f"{ctx.res}/profile-moe-ep4"
        ),
        megatron(ctx, "moe-4gpu-ep1", 400, 4, "dp4", model, *common),
    ]
    if ctx.knob("AGAIN", "1") != "0":
        runs += [
            megatron(ctx, "moe-4gpu-ep1-rerun", 400, 4, "dp4", model, *common),
            megatron(ctx, "moe-4gpu-ep4-rerun", 400, 4, "ep4", model, *common),
        ]
    return [save_model(model), *runs]


def _moe_4gpu_large(ctx: Ctx) -> list:
    """moe-4gpu at the dense MFU rows' step size, 262,144 tokens a GPU: EP=4 with 16k- and 32k-token
    micro-batches, EP=1 with 32k, then EP=1 and EP=4 (32k) again in fresh processes."""
    model = "qwen3-30b-a3b-8l"
    step = words("--remove-padding --logits-chunk-size 4096 --no-recompute-logits")
    step += words("--tokens-per-step 262144 --steps 3 --warmup 2")

    def run(name: str, layout: str, micro: int) -> Run:
        return megatron(ctx, name, 400, 4, layout, model, step, "--max-tokens-per-micro-batch", micro)

    return [
        save_model(model),
        run("moe-4gpu-262k-ep4-mb16k", "ep4", 16384),
        run("moe-4gpu-262k-ep4-mb32k", "ep4", 32768),
        run("moe-4gpu-262k-ep1-mb32k", "dp4", 32768),
        run("moe-4gpu-262k-ep1-mb32k-rerun", "dp4", 32768),
        run("moe-4gpu-262k-ep4-mb32k-rerun", "ep4", 32768),
    ]


def _moe_4gpu_stacked(ctx: Ctx) -> list:
    """moe-4gpu-large's best layout (EP=1, 32k micro-batches) and its re-run, then EP=4, after the experts
    were stacked once per step (rlcore_megatron.experts.stacked_once)."""
    model = "qwen3-30b-a3b-8l"
    step = words("--remove-padding --logits-chunk-size 4096 --no-recompute-logits")
    step += words("--tokens-per-step 262144 --steps 3 --warmup 2 --max-tokens-per-micro-batch 32768")

    def run(name: str, layout: str) -> Run:
        return megatron(ctx, name, 400, 4, layout, model, step)

    return [
        save_model(model),
        run("moe-stacked-ep1-mb32k", "dp4"),
        run("moe-stacked-ep1-mb32k-rerun", "dp4"),
        run("moe-stacked-ep4-mb32k", "ep4"),
    ]


def _moe_4gpu_overlap(ctx: Ctx) -> list:
    """The EP=1 row with megatron.overlap_grad_reduce: the data-parallel reduce-scatter of the gradients
    (5.6B of them in fp32 at this shape) runs in buckets during the backward instead of after it. Twice."""
    model = "qwen3-30b-a3b-8l"
    step = words("--remove-padding --logits-chunk-size 4096 --no-recompute-logits --overlap-grad-reduce")
    step += words("--tokens-per-step 262144 --steps 3 --warmup 2 --max-tokens-per-micro-batch 32768")
    return [
        save_model(model),
        megatron(ctx, "moe-overlap-ep1-mb32k", 400, 4, "dp4", model, step),
        megatron(ctx, "moe-overlap-ep1-mb32k-rerun", 400, 4, "dp4", model, step),
    ]


def _moe_gc(ctx: Ctx) -> list:
    """Is the MoE step's 100 ms end-of-step device idle Python's garbage collector? The 4-layer shape on one
    GPU at 65,536 tokens a step, profiled, with the collector as Python runs it and with it off."""
    model = "qwen3-30b-a3b-4l"
    common = (TP1, words("--tokens-per-step 65536 --steps 3 --warmup 2 --probe-tokens 1024"))

    def run(name: str, *extra: str) -> Run:
        return megatron(
            ctx, name, 150, 1, "tp1", model, *common, "--profile", f"{ctx.res}/profile-{name}", *extra
        )

    return [save_model(model), run("moe-gc-default"), run("moe-gc-manual", "--manual-gc")]


def _7b(ctx: Ctx) -> list:
    common = words("--tokens-per-step 65536 --max-tokens-per-micro-batch 4096 --steps 3 --warmup 2")
    m = megatron(
        ctx,
        "7b-megatron",
        560,
        2,
        "tp2",
        "qwen2.5-7b",
        words("--remove-padding --logits-chunk-size 4096"),
        _tp2_compile(ctx),
        common,
    )
    fsdp_args = words(
        "--systems fsdp-mp-varlen-compile --no-reshard-after-forward --reduce-grads-once-per-step --logits-chunk-size 4096 --no-recompute-logits"
    )
    return [save_model("qwen2.5-7b"), m, fsdp(ctx, "7b-fsdp", 560, 2, "qwen2.5-7b", fsdp_args, common)]


def _profile(ctx: Ctx) -> list:
    args = (
        TP1,
        "--tokens-per-step",
        "65536",
        "--steps",
        "2",
        "--warmup",
        "2",
        "--profile",
        f"{ctx.res}/profile",
    )
    run = megatron(
        ctx,
        "profile",
        300,
        1,
        "tp1",
        "qwen2.5-0.5b",
        *args,
        env={"CUDA_VISIBLE_DEVICES": "0"},
        out="profile-0.5b",
    )
    return [save_model("qwen2.5-0.5b"), run]


def _tp2(ctx: Ctx) -> list:
    args = (
        MEGATRON,
        _tp2_compile(ctx),
        "--overlap-grad-reduce",
        words("--tokens-per-step 65536 --steps 5 --warmup 3"),
        "--profile",
        f"{ctx.res}/profile-tp2",
    )
    return [
        save_model("qwen2.5-0.5b"),
        megatron(ctx, "tp2", 400, 2, "tp2 dp2 pp2", "qwen2.5-0.5b", *args, out="tp2-0.5b"),
    ]


def _tp2_only(name: str, profiled: bool):
    def build(ctx: Ctx) -> list:
        prof = ("--profile", f"{ctx.res}/profile-{name}") if profiled else ()
        args = (MEGATRON, _tp2_compile(ctx), workload("qwen2.5-0.5b"), prof)
        return [
            save_model("qwen2.5-0.5b"),
            megatron(ctx, name, 300, 2, "tp2", "qwen2.5-0.5b", *args, out=f"{name}-0.5b"),
        ]

    return build


def _tp2_15b(ctx: Ctx) -> list:
    args = (
        MEGATRON,
        _tp2_compile(ctx),
        "--overlap-grad-reduce",
        words("--tokens-per-step 262144 --steps 3 --warmup 2"),
    )
    return [save_model("qwen2.5-1.5b"), megatron(ctx, "tp2-1.5b", 400, 2, "tp2 dp2", "qwen2.5-1.5b", *args)]


def _tp1(size: str):
    model = f"qwen2.5-{size}"
    return lambda ctx: [
        save_model(model),
        megatron(
            ctx,
            f"tp1-{size}",
            400,
            1,
            "tp1",
            model,
            TP1,
            workload(model),
            "--compile",
            env={"CUDA_VISIBLE_DEVICES": "0"},
        ),
    ]


def _tp2_15b_alone(name: str):
    return lambda ctx: [
        save_model("qwen2.5-1.5b"),
        megatron(
            ctx, name, 400, 2, "tp2", "qwen2.5-1.5b", MEGATRON, _tp2_compile(ctx), workload("qwen2.5-1.5b")
        ),
    ]


BIG = ("--max-tokens-per-micro-batch", "32768")


def _mb32k_tp2(ctx: Ctx) -> Run:
    return megatron(
        ctx,
        "mb32k-tp2",
        400,
        2,
        "tp2",
        "qwen2.5-0.5b",
        MEGATRON,
        BIG,
        _tp2_compile(ctx),
        workload("qwen2.5-0.5b"),
    )


def _mb32k(ctx: Ctx) -> list:
    """TP=1 at 32k micro-batches on GPU 0 alone (so that TP=2's baseline is no weaker), then TP=2 on both."""
    tp1 = megatron(
        ctx,
        "mb32k-tp1",
        400,
        1,
        "tp1",
        "qwen2.5-0.5b",
        TP1,
        BIG,
        workload("qwen2.5-0.5b"),
        "--compile",
        env={"CUDA_VISIBLE_DEVICES": "0"},
    )
    return [save_model("qwen2.5-0.5b"), tp1, _mb32k_tp2(ctx)]


def _mb32k_threads(ctx: Ctx) -> list:
    """2 intra-op threads a rank (4 for the two), then the default (the host's cores shared out)."""
    out = [save_model("qwen2.5-0.5b")]
    for cpus in ("4", ""):
        name = f"mb32k-tp2-cpus{cpus or 'all'}"
        args = (MEGATRON, BIG, _tp2_compile(ctx), workload("qwen2.5-0.5b"))
        out.append(megatron(ctx, name, 300, 2, "tp2", "qwen2.5-0.5b", *args, env={"BENCH_HOST_CPUS": cpus}))
    return out


def _tp2_keep(size: str):
    model = f"qwen2.5-{size}"
    return lambda ctx: [
        save_model(model),
        megatron(ctx, f"tp2-keep-{size}", 400, 2, "tp2", model, TP1, BIG, _tp2_compile(ctx), workload(model)),
    ]


def _defaults(ctx: Ctx) -> list:
    """The first session's TP=2 and PP=2 rows: the script's defaults (0.5B shape, 65,536 tokens per GPU)."""
    return [
        Run(
            "megatron-defaults",
            560,
            (PY, "benchmarks/megatron_gpu.py", "--out", f"{ctx.res}/megatron_gpu.json"),
            show="^(tp2|pp2)",
        )
    ]


def _topo(ctx: Ctx) -> list:
    text = "{ nvidia-smi topo -m; nvidia-smi --query-gpu=name,pci.bus_id,clocks.max.sm --format=csv; nproc; }"
    return [
        Run("topo", 60, ("bash", "-c", f"{text} >> {ctx.res}/topo.txt 2>&1; cat {ctx.res}/topo.txt"), path=())
    ]


def _nccl(ctx: Ctx) -> list:
    topo = Run(
        "topo-m",
        60,
        ("bash", "-c", f"nvidia-smi topo -m > {ctx.res}/topo.txt 2>&1; cat {ctx.res}/topo.txt"),
        path=(),
    )
    return [
        topo,
        Run("nccl", 120, (PY, "benchmarks/gpu/allreduce_probe.py", "--out", f"{ctx.res}/allreduce.json")),
    ]


def _stage(name, doc, seconds, build, gpus=2, script="benchmarks/megatron_gpu.py", h200=False):
    return Stage(f"megatron-{name}", doc, script, seconds, build, ("megatron",), gpus=gpus, h200=h200)


STAGES = [
    _stage(
        "pair-0.5b",
        "Megatron TP=1 on GPU 0 beside FSDP's tuned setting on GPU 1, 0.5B",
        130,
        _pair("pair-0.5b", "qwen2.5-0.5b", 65536, 5, 3, "0", "1"),
    ),
    _stage(
        "pair-1.5b",
        "the same at 1.5B, 262,144 tokens per step (the MFU rows)",
        130,
        _pair("pair-1.5b", "qwen2.5-1.5b", 262144, 3, 2, "0", "1"),
    ),
    _stage(
        "swap-0.5b",
        "pair-0.5b with the GPUs swapped (its independent re-run)",
        130,
        _pair("swap-0.5b", "qwen2.5-0.5b", 65536, 5, 3, "1", "0"),
    ),
    _stage(
        "swap-1.5b",
        "pair-1.5b with the GPUs swapped",
        130,
        _pair("swap-1.5b", "qwen2.5-1.5b", 262144, 3, 2, "1", "0"),
    ),
    _stage(
        "compile-0.5b",
        "Megatron TP=1 with megatron.compile on GPU 0 beside the same without on GPU 1",
        130,
        _compile("0.5b"),
    ),
    _stage("compile-1.5b", "the same at 1.5B", 160, _compile("1.5b")),
    _stage(
        "seq-0.5b",
        "on one GPU, one after another: Megatron compiled (profiled), eager (EAGER=0: not), FSDP (SKIP_FSDP=1: not)",
        200,
        _rows("seq-0.5b", "qwen2.5-0.5b"),
        gpus=1,
    ),
    _stage("seq-1.5b", "the same at 1.5B", 300, _rows("seq-1.5b", "qwen2.5-1.5b"), gpus=1),
    _stage(
        "rerun-0.5b",
        "seq-0.5b again, named rerun-* (the independent re-run of its rows)",
        200,
        _rows("rerun-0.5b", "qwen2.5-0.5b"),
        gpus=1,
    ),
    _stage("rerun-1.5b", "seq-1.5b again, named rerun-*", 300, _rows("rerun-1.5b", "qwen2.5-1.5b"), gpus=1),
    _stage(
        "run3-0.5b",
        "a third time, named run3-* (a median of three)",
        200,
        _rows("run3-0.5b", "qwen2.5-0.5b"),
        gpus=1,
    ),
    _stage("run3-1.5b", "a third time at 1.5B", 300, _rows("run3-1.5b", "qwen2.5-1.5b"), gpus=1),
    _stage(
        "seq2-0.5b",
        "seq-0.5b on GPU 0 and rerun-0.5b on GPU 1 at once: the row and its re-run from one call",
        220,
        _seq2("0.5b"),
    ),
    _stage("seq2-1.5b", "the same at 1.5B", 320, _seq2("1.5b")),
    _stage(
        "moe-1gpu",
        "Qwen3-30B-A3B's layer shape with 4 layers on one GPU: Megatron TP=1 with grouped-GEMM experts, then the per-expert loop (LOOP=0: not)",
        280,
        _moe_1gpu,
        gpus=1,
    ),
    _stage(
        "moe-4gpu",
        "Qwen3-30B-A3B's layer shape with 8 layers on 4 GPUs: Megatron EP=4 (profiled) against EP=1, then both again (AGAIN=0: not); issue 36's megatron-qwen3-moe-4gpu row and its re-run",
        600,
        _moe_4gpu,
        gpus=4,
        h200=True,
    ),
    _stage(
        "moe-gc",
        "the 4-layer MoE shape on one GPU, profiled, with Python's garbage collector on and off during the steps",
        240,
        _moe_gc,
        gpus=1,
    ),
    _stage(
        "moe-4gpu-large",
        "moe-4gpu at 262,144 tokens a GPU and step: EP=4 with 16k and 32k micro-batches, EP=1 with 32k, then EP=1 and EP=4 again",
        480,
        _moe_4gpu_large,
        gpus=4,
        h200=True,
    ),
    _stage(
        "moe-4gpu-stacked",
        "moe-4gpu-large's EP=1 row and re-run, then EP=4, with the experts stacked once per step",
        360,
        _moe_4gpu_stacked,
        gpus=4,
        h200=True,
    ),
    _stage(
        "moe-4gpu-overlap",
        "the EP=1 MoE row and its re-run with the gradient reduce-scatter overlapped with the backward",
        260,
        _moe_4gpu_overlap,
        gpus=4,
        h200=True,
    ),
    _stage(
        "seq2-qwen3-1.7b",
        "the same with the Qwen3-1.7B shape (q/k norms; issue 36's megatron-qwen3-dense-tp1 row and its re-run)",
        340,
        _seq2("qwen3-1.7b", "qwen3-1.7b"),
    ),
    _stage(
        "seq-qwen3-1.7b",
        "seq2-qwen3-1.7b on one GPU: the row (Megatron compiled, profiled; FSDP tuned, profiled), Megatron with "
        "megatron-core's fused gate/up MLP, then the row's re-run",
        560,
        _seq_then_rerun("qwen3-1.7b", "qwen3-1.7b"),
        gpus=1,
    ),
    _stage(
        "tp2", "Megatron TP=2, DP=2 and PP=2 over both GPUs (0.5B), each profiling one more step", 110, _tp2
    ),
    _stage("tp2-only", "Megatron TP=2 alone (0.5B), profiled: the TP=2 row", 90, _tp2_only("tp2-only", True)),
    _stage("tp2-only-rerun", "its re-run, not profiled", 80, _tp2_only("tp2-only-rerun", False)),
    _stage("tp2-1.5b", "Megatron TP=2 and DP=2 over both GPUs (1.5B)", 200, _tp2_15b),
    _stage(
        "tp1-0.5b",
        "Megatron TP=1 (compiled) alone on GPU 0: the TP=2 scaling rows' baseline",
        80,
        _tp1("0.5b"),
        gpus=1,
    ),
    _stage("tp1-1.5b", "the same at 1.5B", 120, _tp1("1.5b"), gpus=1),
    _stage(
        "tp2-1.5b-only",
        "Megatron TP=2 alone (1.5B, tp1-1.5b's workload per GPU)",
        120,
        _tp2_15b_alone("tp2-1.5b-only"),
    ),
    _stage("tp2-1.5b-rerun", "its re-run", 120, _tp2_15b_alone("tp2-1.5b-rerun")),
    _stage("mb32k", "32,768-token micro-batches (0.5B): TP=1 on GPU 0 alone, then TP=2 on both", 160, _mb32k),
    _stage(
        "mb32k-tp2",
        "the TP=2 half of mb32k alone (its re-runs)",
        80,
        lambda ctx: [save_model("qwen2.5-0.5b"), _mb32k_tp2(ctx)],
    ),
    _stage(
        "mb32k-threads",
        "TP=2 at 32k micro-batches with 2 intra-op threads a rank, then with the default",
        160,
        _mb32k_threads,
    ),
    _stage(
        "tp2-keep-0.5b",
        "Megatron TP=2 (compiled), the head keeping its logits slice, 32k micro-batches (0.5B)",
        90,
        _tp2_keep("0.5b"),
    ),
    _stage("tp2-keep-1.5b", "the same at 1.5B", 130, _tp2_keep("1.5b")),
    _stage(
        "7b",
        "a 7B shape over both GPUs: Megatron TP=2, then FSDP on the same two GPUs (needs H200 memory)",
        330,
        _7b,
        h200=True,
    ),
    _stage(
        "defaults",
        "megatron_gpu.py's defaults: TP=2 and PP=2, 0.5B (the first session's rows)",
        200,
        _defaults,
    ),
    _stage(
        "topo",
        "the GPUs' topology (nvidia-smi topo -m), names and cores into topo.txt",
        5,
        _topo,
        gpus=1,
        script="benchmarks/gpu/allreduce_probe.py",
    ),
    _stage(
        "nccl",
        "the topology and NCCL all-reduce times at a TP=2 step's sizes (allreduce_probe.py)",
        60,
        _nccl,
        script="benchmarks/gpu/allreduce_probe.py",
    ),
]

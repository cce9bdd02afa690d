"""rlcore-vllm on the vLLM bundle (the machine's transformers), and both rollout engines side by side.

PYTHONPATH is /tmp/proj, then /tmp/vsite; VLLM_USE_FLASHINFER_SAMPLER=0 (no FlashInfer in the bundle).
"""

from __future__ import annotations

from ..actions import PY, Ctx, FreeGpu, Run, cmd, words
from .base import Stage

ENGINE_ARGS = (
    "--batch 64 256 --new-tokens 256 --shape 0.5B --sync-shapes 0.5B 1.5B --bucket-mib 512 --repeats 3"
)


def _sync(shapes: tuple[str, ...], limit: int):
    """One process per size: an in-process vLLM engine keeps its memory after shutdown."""

    def build(ctx: Ctx) -> list:
        actions: list = []
        for s in shapes:
            argv = cmd(
                PY,
                "benchmarks/vllm_gpu.py",
                "--batch",
                "--sync-shapes",
                s,
                "--bucket-mib",
                "512",
                "--repeats",
                "5",
            )
            actions += [FreeGpu(), Run(f"sync-{s}", limit, argv + ("--out", f"{ctx.res}/vllm_sync_{s}.json"))]
        return actions

    return build


def _throughput(runs: str):
    def build(ctx: Ctx) -> list:
        argv = cmd(
            PY,
            "benchmarks/vllm_gpu.py",
            words("--batch 64 256 --new-tokens 256 --shape 0.5B --sync-shapes"),
            words(runs),
        )
        return [FreeGpu(), Run("vllm-throughput", 330, argv + ("--out", f"{ctx.res}/vllm_throughput.json"))]

    return build


def _engines(ctx: Ctx) -> list:
    """SGLang, then vLLM, each in its own process with its own PYTHONPATH (SGLang's pinned transformers,
    the machine's for vLLM), every process holding the GPU ended before each."""
    res = ctx.res
    return [
        FreeGpu(),
        Run(
            "bench-sglang",
            280,
            cmd(PY, "benchmarks/sglang_gpu.py", words(ENGINE_ARGS), "--out", f"{res}/sglang_gpu_h100.json"),
            path=("/tmp/proj", "/tmp/site"),
            tail=25,
        ),
        FreeGpu(),
        # vLLM in-process keeps its memory after shutdown (a second engine would not fit): 1.5B's sync apart.
        Run(
            "bench-vllm",
            220,
            cmd(
                PY,
                "benchmarks/vllm_gpu.py",
                words(ENGINE_ARGS.replace("0.5B 1.5B", "0.5B")),
                "--out",
                f"{res}/vllm_gpu_h100.json",
            ),
            path=("/tmp/proj", "/tmp/vsite"),
            tail=25,
        ),
        FreeGpu(),
        Run(
            "bench-vllm-1.5b",
            150,
            cmd(
                PY,
                "benchmarks/vllm_gpu.py",
                words(
                    "--batch --new-tokens 256 --shape 1.5B --sync-shapes 1.5B --bucket-mib 512 --repeats 3"
                ),
                "--out",
                f"{res}/vllm_gpu_h100_1.5b.json",
            ),
            path=("/tmp/proj", "/tmp/vsite"),
            tail=25,
        ),
        Run(
            "rollout_engines",
            120,
            cmd(
                PY,
                "benchmarks/rollout_engines.py",
                f"{res}/vllm_gpu_h100.json",
                f"{res}/sglang_gpu_h100.json",
                "--more-vllm",
                f"{res}/vllm_gpu_h100_1.5b.json",
                "--out",
                f"{res}/rollout_engines_h100.json",
            ),
            path=(),
        ),
    ]


def _gap_vllm(ctx: Ctx, name: str, where: str, limit: int, systems: tuple[str, ...] = ()) -> list:
    """One ``vllm_gap_gpu.py`` process (engine core ``where``: ``in`` or ``own``), its JSON ``gap_vllm_<name>``;
    ``systems``: those to time (default: the script's)."""
    argv = cmd(
        PY, "benchmarks/vllm_gap_gpu.py", "--engine-process", where, "--repeats", ctx.knob("REPEATS", "3")
    )
    if systems:
        argv += ("--systems", *systems)
    argv += ("--out", f"{ctx.res}/gap_vllm_{name}.json")
    return [FreeGpu(), Run(f"gap-vllm-{name}", limit, argv, path=("/tmp/proj", "/tmp/vsite"), tail=12)]


def _gap(ctx: Ctx) -> list:
    """Issue 35's ``rollout-vllm-vs-sglang-b256`` with its reason: vLLM's batch-256 time taken apart
    (``vllm_gap_gpu.py``: the plugin's engine core in its process, then in a process of its own, each
    with log-probs and detokenization on and off), then SGLang's plugin and raw engine on the same
    workload, each in a process of its own."""
    return _gap_vllm(ctx, "in", "in", 270) + _gap_vllm(ctx, "own", "own", 270) + _gap_sglang(ctx)


def _gap_sglang(ctx: Ctx) -> list:
    """SGLang's plugin and raw engine on vllm-gap's workload (batch 256, 128+256 tokens, log-probs)."""
    argv = cmd(
        PY,
        "benchmarks/sglang_gpu.py",
        words("--batch 256 --new-tokens 256 --shape 0.5B --sync-shapes --repeats"),
        ctx.knob("REPEATS", "3"),
        "--out",
        f"{ctx.res}/gap_sglang.json",
    )
    return [FreeGpu(), Run("gap-sglang", 240, argv, path=("/tmp/proj", "/tmp/site"), tail=12)]


def _gap_flat(ctx: Ctx) -> list:
    """After the fix: the plugin (flat log-probs, texts decoded afterwards) next to the old request
    (``raw``), the fix's two halves raw, and the ceiling without log-probs; in-process, one engine."""
    systems = ("plugin", "raw", "raw-flat", "raw-flat-no-detok", "raw-no-logprobs")
    return _gap_vllm(ctx, "flat", "in", 300, systems)


STAGES = [
    Stage(
        "vllm-tests",
        "the ipc transport's GPU test (a second process reads the same bytes; the sender's buffer freed on release)",
        "core/tests/transports/test_ipc.py",
        60,
        lambda ctx: [
            Run(
                "ipc-tests",
                200,
                (
                    PY,
                    "-m",
                    "pytest",
                    "core/tests/transports/test_ipc.py",
                    "-v",
                    "-rA",
                    f"--junitxml={ctx.res}/ipc-tests.xml",
                ),
            )
        ],
        ("vllm",),
    ),
    Stage(
        "vllm-sync",
        "vllm_gpu.py sync rows, one process per size: 0.5B, 1.5B, 7B",
        "benchmarks/vllm_gpu.py",
        450,
        _sync(("0.5B", "1.5B", "7B"), 230),
        ("vllm",),
    ),
    Stage(
        "vllm-sync-small",
        "vllm_gpu.py sync rows for 0.5B and 1.5B (each way, against the copy floor)",
        "benchmarks/vllm_gpu.py",
        250,
        _sync(("0.5B", "1.5B"), 200),
        ("vllm",),
    ),
    Stage(
        "vllm-throughput",
        "vllm_gpu.py: plugin against raw vLLM, interleaved, 5 repeats, with the per-request-seed system",
        "benchmarks/vllm_gpu.py",
        250,
        _throughput("--repeats 5 --request-seeds"),
        ("vllm",),
    ),
    Stage(
        "vllm-throughput7",
        "vllm_gpu.py: plugin against raw vLLM, 7 interleaved repeats, without the per-request-seed system",
        "benchmarks/vllm_gpu.py",
        250,
        _throughput("--repeats 7"),
        ("vllm",),
    ),
    Stage(
        "engines-bench",
        "sglang_gpu.py then vllm_gpu.py (same arguments), then rollout_engines.py side by side",
        "benchmarks/rollout_engines.py",
        420,
        _engines,
        ("vllm", "sglang"),
    ),
    Stage(
        "vllm-gap",
        "where vLLM's batch-256 time goes (engine core in or out of process; log-probs, detokenization), "
        "then SGLang on the same workload (issue 35's rollout-vllm-vs-sglang-b256)",
        "benchmarks/vllm_gap_gpu.py",
        600,
        _gap,
        ("vllm", "sglang"),
    ),
    Stage(
        "vllm-gap-flat",
        "the vLLM plugin with flat log-probs and texts decoded afterwards, beside the old request and the "
        "ceiling without log-probs (the fix of vllm-gap's finding)",
        "benchmarks/vllm_gap_gpu.py",
        240,
        _gap_flat,
        ("vllm",),
    ),
    Stage(
        "sglang-b256",
        "SGLang's plugin and raw engine on vllm-gap's workload alone",
        "benchmarks/sglang_gpu.py",
        150,
        _gap_sglang,
        ("sglang",),
    ),
]

"""Stages of their own: kernel-level rows, and the machine-keeping ones (setup, free-gpu)."""

from __future__ import annotations

from pathlib import Path

from ..actions import PY, Do, FreeGpu, Run
from ..device import install_project
from .base import Stage

# flash-attn-4 needs no project install: core goes on PYTHONPATH as a folder. The DSL's own folder too,
# because a --target unpack does not run the .pth file that adds it.
FA4_PATH = ("core", "/tmp/fa4site", "/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages")

STAGES = [
    Stage(
        "setup",
        "install the project into /tmp/proj again (the stages install it once per machine; after a code change)",
        "core/pyproject.toml",
        30,
        lambda ctx: [
            Do(
                "rm -rf /tmp/proj; pip install --no-deps --no-index --target /tmp/proj ./core ./plugins/...",
                lambda ctx: install_project(Path(ctx.res), force=True),
            )
        ],
        project=False,
    ),
    Stage(
        "free-gpu",
        "end every process holding the GPU (by pid)",
        "benchmarks/gpu/device.py",
        5,
        lambda ctx: [FreeGpu()],
        project=False,
    ),
    Stage(
        "moe-experts",
        "moe_experts_gpu.py: one Qwen3-30B-A3B expert layer, sequential per-expert matmuls against torch's grouped GEMM "
        "and a padded bmm, fwd + bwd, 16k tokens (twice: the row and its re-run), 4k tokens, even routing",
        "benchmarks/moe_experts_gpu.py",
        90,
        lambda ctx: [
            Run(
                f"moe-experts-{name}",
                120,
                (PY, "benchmarks/moe_experts_gpu.py", *args, "--out", f"{ctx.res}/moe_experts_{name}.json"),
            )
            for name, args in (
                ("16k", ()),
                ("16k_rerun", ()),
                ("4k", ("--tokens", "4096")),
                ("16k_even", ("--skew", "0")),
            )
        ],
        project=False,
        path=("core",),
    ),
    Stage(
        "fa4-attention",
        "attention_gpu.py: flash-attn-4's var-len kernel against PyTorch's, fwd + bwd, 0.5B / 1.5B / 7B heads",
        "benchmarks/attention_gpu.py",
        40,
        lambda ctx: [
            Run(
                "attention",
                300,
                (
                    PY,
                    "benchmarks/attention_gpu.py",
                    "--out",
                    f"{ctx.res}/attention_h100.json",
                    "--shapes",
                    "0.5B",
                    "1.5B",
                    "7B",
                ),
            )
        ],
        ("fa4",),
        project=False,
        path=FA4_PATH,
    ),
    Stage(
        "logits-kernels",
        "logits_kernels.py: the log-prob head's statistics and gradient kernels on one [4096, 151936] chunk",
        "benchmarks/logits_kernels.py",
        60,
        lambda ctx: [
            Run(
                "logits_kernels",
                300,
                (PY, "benchmarks/logits_kernels.py", "--out", f"{ctx.res}/logits_kernels.json"),
            )
        ],
    ),
]

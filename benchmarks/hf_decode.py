"""The HF rollout's two decode paths side by side: ``hf.decode: loop`` (rlcore's own decode loop) against
``hf.decode: generate`` (``model.generate`` with a log-prob recorder), issue 19.

Both engines load the tiny Qwen2 model (``rlcore.testing.tiny``, fp32, the model of
``benchmarks/vs_trl_cpu.py``) in this one process and get the same requests: the 2-digit-addition prompts of
``vs_trl_cpu.py`` in the tiny tokenizer's chat template (17-18 tokens), ``samples`` per prompt,
temperature 1 with log-probs, up to ``max_tokens`` new tokens, the default ``hf.batch_size`` (64 rows
per chunk). Sizes are prompts x samples x max new tokens, as in ``vs_trl_cpu.py``: ``small`` 8 x 4 x 32
and ``large`` 64 x 8 x 128. Calls alternate between the paths (A B B A ...), each repeat with a new seed
given to both, after one warm-up call each; reported per path: the median, min and max wall time of one
``generate`` call and the tokens it returned, and the ratio of the medians (loop / generate).

    python benchmarks/hf_decode.py [--sizes small large] [--repeats 12] [--device cpu]
        [--out benchmarks/results/vs_trl_cpu/hf_decode.json]

Prints a table and markdown rows ``| name | value | unit | hardware | command |``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _machine import cpu_name  # benchmarks/, the script's folder, leads sys.path
from rlcore.api import RolloutSpec, SamplingParams
from rlcore.devices import get_platform
from rlcore.rollout.config import HFRolloutConfig
from rlcore.rollout.hf import HFRollout
from rlcore.testing.tiny import build_tiny_model

SIZES = {"tiny": (2, 2, 8), "small": (8, 4, 32), "large": (64, 8, 128)}
MODES = ("generate", "loop")


def hardware(device: str) -> str:
    if device != "cpu":
        return torch.cuda.get_device_name(0)
    cpu = cpu_name()
    return f"CPU {cpu}, {os.cpu_count()} cores, torch {torch.get_num_threads()} threads"


def addition_prompts(tokenizer, count: int, seed: int = 0) -> list[list[int]]:
    """``vs_trl_cpu.py``'s prompts (``What is a + b?``, 2-digit numbers) as chat-templated token ids."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        messages = [{"role": "user", "content": f"What is {a} + {b}?"}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return prompts


def timed(engine: HFRollout, prompts, params: SamplingParams, device: str) -> tuple[float, int]:
    start = time.perf_counter()
    out = engine.generate(prompts, params)
    if device != "cpu":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return seconds, sum(len(c.token_ids) for group in out for c in group)


def git_commit() -> str:
    """HEAD, with ``+dirty`` when the rollout's code or this script differ from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        paths = ["core/rlcore/rollout", "benchmarks/hf_decode.py"]
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", *paths], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["small", "large"], choices=list(SIZES))
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model", type=Path, default=Path(tempfile.gettempdir()) / "rlcore-bench-tiny")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()

    model = build_tiny_model(args.model)
    device_platform = get_platform(args.device)
    if args.device != "cpu":
        device_platform.set_device(0)
    spec = RolloutSpec(model_path=str(model), dtype="float32", seed=0)
    engines = {mode: HFRollout(spec, HFRolloutConfig(decode=mode), device_platform) for mode in MODES}
    prompts_all = addition_prompts(engines["loop"].tokenizer, max(SIZES[s][0] for s in args.sizes))
    command = f"python benchmarks/hf_decode.py --sizes {' '.join(args.sizes)} --repeats {args.repeats}" + (
        f" --device {args.device}" if args.device != "cpu" else ""
    )

    records, rows = [], []
    print(f"{'size':6s} {'decode':9s} {'median s':>9s} {'min':>8s} {'max':>8s} {'tokens':>7s}")
    for size in args.sizes:
        n_prompts, samples, max_tokens = SIZES[size]
        prompts = prompts_all[:n_prompts]
        seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
        tokens: dict[str, list[int]] = {mode: [] for mode in MODES}
        for mode in MODES:  # warm-up: first-call allocations and caches
            timed(
                engines[mode], prompts, SamplingParams(n=samples, max_tokens=max_tokens, seed=0), args.device
            )
        for repeat in range(args.repeats):
            params = SamplingParams(n=samples, temperature=1.0, max_tokens=max_tokens, seed=1 + repeat)
            for mode in MODES if repeat % 2 == 0 else MODES[::-1]:
                s, t = timed(engines[mode], prompts, params, args.device)
                seconds[mode].append(s)
                tokens[mode].append(t)
        medians = {mode: statistics.median(seconds[mode]) for mode in MODES}
        for mode in MODES:
            print(
                f"{size:6s} {mode:9s} {medians[mode]:9.4f} {min(seconds[mode]):8.4f} {max(seconds[mode]):8.4f} "
                f"{statistics.median(tokens[mode]):7.0f}"
            )
            records.append(
                {
                    "size": size,
                    "prompts": n_prompts,
                    "samples": samples,
                    "max_tokens": max_tokens,
                    "decode": mode,
                    "median_s": medians[mode],
                    "min_s": min(seconds[mode]),
                    "max_s": max(seconds[mode]),
                    "seconds": seconds[mode],
                    "tokens": tokens[mode],
                }
            )
            rows.append(
                f"| hf rollout decode={mode}, {n_prompts}x{samples}x{max_tokens} | {medians[mode]:.4f} | s/call "
                f"(min {min(seconds[mode]):.4f}, max {max(seconds[mode]):.4f}) | {hardware(args.device)} | "
                f"`{command}` |"
            )
        ratio = medians["loop"] / medians["generate"]
        print(f"{size:6s} {'loop/gen':9s} {ratio:9.3f}")
        rows.append(
            f"| hf rollout loop / generate, {n_prompts}x{samples}x{max_tokens} | {ratio:.3f} | x | "
            f"{hardware(args.device)} | `{command}` |"
        )
    print("\n| name | value | unit | hardware | command |\n|---|---|---|---|---|")
    print("\n".join(rows))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "command": command,
                    "hardware": hardware(args.device),
                    "torch": torch.__version__,
                    "commit": git_commit(),
                    "load_average": os.getloadavg(),
                    "results": records,
                    "rows": rows,
                },
                indent=2,
            )
            + "\n"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()

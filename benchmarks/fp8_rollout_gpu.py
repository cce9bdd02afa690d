"""FP8 rollout against bf16 on one GPU (issue 53): generation throughput, and the sync that quantizes again.

One engine plugin per process (``--engine vllm`` or ``sglang``: their bundles are apart), at the plugin's
defaults apart from ``rollout.quantization``. The model is random (no downloads), in the shape of
Qwen2.5-1.5B (``benchmarks/vllm_gpu.py``: bf16, tied embeddings, vocabulary 151936), seed 0.

For each of bf16 (``quantization: null``) and fp8, an engine of its own, one after the other:

1. **Throughput.** ``--batch`` prompts of 128 random tokens, ``--new-tokens`` new tokens each (a random
   model almost never samples its end token), temperature 1, log-probs on; one warm-up call, then
   ``--repeats`` calls on fresh prompts; tokens per second as median and range.
2. **The post-sync gap.** The mean |rollout - trainer| log-prob of sampled tokens against an HF bf16 model
   of the same weights (the pair's floor), then after a weight load of another model (seed 1) against
   that model (``after_sync``: the engine quantized the new weights) and against the old one
   (``after_sync_vs_old``: what it would be had the load not taken effect).

The row's ratio is fp8's median over bf16's. ``--out`` gets JSON after each engine.

    python benchmarks/fp8_rollout_gpu.py --engine vllm --out fp8_vllm.json [--batch 256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from rlcore.api import RolloutSpec, SamplingParams
from rlcore.devices import get_platform
from rlcore.weights import bucketize

sys.path.insert(0, str(Path(__file__).parent))
from vllm_gpu import logprob_gap, random_model, random_prompts, save_model, spread  # noqa: E402


def make_engine(engine: str, path: Path, quantization: str | None, platform, args):
    spec = RolloutSpec(
        model_path=str(path),
        dtype="bfloat16",
        max_model_len=128 + args.new_tokens + 64,
        gpu_memory_utilization=args.memory_fraction,
        seed=0,
        quantization=quantization,
    )
    if engine == "vllm":
        from rlcore_vllm.config import VLLMConfig
        from rlcore_vllm.engine import VLLMRollout

        return VLLMRollout(spec, VLLMConfig(kv_cache_memory_gib=args.kv_cache_gib), platform)
    from rlcore_sglang.config import SGLangConfig
    from rlcore_sglang.engine import SGLangRollout

    return SGLangRollout(spec, SGLangConfig(), platform)


def tokens_per_s(engine, batch: int, new_tokens: int, seed: int) -> float:
    params = SamplingParams(temperature=1.0, max_tokens=new_tokens, seed=seed)
    start = time.perf_counter()
    out = engine.generate(random_prompts(batch, seed), params)
    return sum(len(c.token_ids) for per in out for c in per) / (time.perf_counter() - start)


def measure(engine_name: str, path: Path, quantization: str | None, trainers, platform, args) -> dict:
    started = time.perf_counter()
    engine = make_engine(engine_name, path, quantization, platform, args)
    record: dict = {"quantization": quantization or "none", "start_s": time.perf_counter() - started}
    try:
        tokens_per_s(engine, args.batch, args.new_tokens, seed=0)  # warm-up
        runs = [tokens_per_s(engine, args.batch, args.new_tokens, seed=1 + r) for r in range(args.repeats)]
        record.update(tokens_per_s=statistics.median(runs), spread=spread(runs), runs=runs)
        print(f"  {record['quantization']}: {record['tokens_per_s']:.0f} tok/s ({runs})", flush=True)
        old, new = trainers
        record["gap_same_weights"] = logprob_gap(engine, old)
        named = [(n, p.detach()) for n, p in new.named_parameters()]
        started = time.perf_counter()
        engine.load_weights(bucketize(named, 512 * 2**20, dtype=torch.bfloat16))
        platform.synchronize()
        record["load_weights_s"] = time.perf_counter() - started
        record["gap_after_sync"] = logprob_gap(engine, new)
        record["gap_after_sync_vs_old"] = logprob_gap(engine, old)
        print(
            f"  gaps: same weights {record['gap_same_weights']:.4f}, after sync {record['gap_after_sync']:.4f} "
            f"(against the old weights {record['gap_after_sync_vs_old']:.4f})",
            flush=True,
        )
    finally:
        engine.shutdown()
        del engine
        platform.empty_cache()
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("vllm", "sglang"), required=True)
    parser.add_argument("--shape", default="1.5B")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--memory-fraction", type=float, default=0.5)
    parser.add_argument("--kv-cache-gib", type=float, help="fixed KV cache size (vLLM; needed on cpu)")
    parser.add_argument("--variants", nargs="+", default=["none", "fp8"], help="none and/or fp8 (cpu: none)")
    parser.add_argument("--device", default="cuda", help="rlcore device platform (cpu for a dry run)")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "rlcore-bench-gpu")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    platform = get_platform(args.device)
    device = torch.device(platform.device_type)
    path = args.workdir / f"qwen2-{args.shape}"
    path.mkdir(parents=True, exist_ok=True)
    save_model(path, args.shape, device)
    trainers = (random_model(args.shape, 0, device), random_model(args.shape, 1, device))
    result: dict = {
        "engine": args.engine,
        "shape": args.shape,
        "batch": args.batch,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "defaults": "the plugin's defaults apart from rollout.quantization",
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "command": " ".join(sys.argv),
        "variants": [],
    }
    for variant in args.variants:
        quantization = None if variant == "none" else variant
        result["variants"].append(measure(args.engine, path, quantization, trainers, platform, args))
        args.out.write_text(json.dumps(result, indent=1))
    by = {v["quantization"]: v for v in result["variants"]}
    if "none" in by and "fp8" in by:
        result["fp8_over_bf16"] = by["fp8"]["tokens_per_s"] / by["none"]["tokens_per_s"]
        result["fp8_over_bf16_range"] = [
            by["fp8"]["spread"]["min"] / by["none"]["spread"]["max"],
            by["fp8"]["spread"]["max"] / by["none"]["spread"]["min"],
        ]
        print(f"fp8 / bf16: {result['fp8_over_bf16']:.3f} (range {result['fp8_over_bf16_range']})")
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

"""The SGLang plugin on one GPU: generation throughput against raw ``sglang.Engine``, and colocated
weight-sync time.

The models, prompts and sampling are those of ``vllm_gpu.py`` (imported from it), so the rows compare
with its vLLM rows: random Qwen2.5-0.5B / 1.5B shapes (bf16, tied embeddings, vocab 151936) with a
word-level tokenizer of the same vocabulary.

1. Throughput (0.5B): ``--batch`` prompts of 128 random tokens, 256 new tokens each, temperature 1 with
   log-probs and a seed per sample. The plugin's ``generate`` and a raw ``sglang.Engine.async_generate``
   (one batched call, what ``Engine.generate`` runs) on the same engine with the same SGLang sampling
   parameters run alternately; generated tokens per second, median and spread of ``--repeats``, and the
   ratio of the medians (plugin / raw; goal >= 0.97). The radix cache is flushed before every timed run:
   both systems of a repeat get the same prompts, and the second would otherwise reuse the first's KV.
2. Colocated weight sync (0.5B, 1.5B): a "trainer" HF model on the same GPU exports its parameters as a
   bucketed bf16 stream (``rlcore.weights.bucketize``) straight into ``load_weights`` (flattened buckets
   over CUDA IPC, then a radix-cache flush). Timed end to end, next to the device-to-device copy floor
   (bytes / 3 TB/s, the H100's measured copy rate) and a measured ``copy_`` of the same tensors. After
   each sync the rollout's log-probs of a few sampled tokens are compared with the trainer's.

    python benchmarks/sglang_gpu.py --out sglang_gpu.json [--batch 64 256] [--repeats 3] [--bucket-mib 512]

Prints a table and markdown rows ``| name | value | unit | hardware | command |``; ``--out`` gets JSON
after every phase (a later failure keeps what was measured).
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
from vllm_gpu import (
    COPY_FLOOR_BYTES_PER_S,
    PROMPT_LEN,
    SHAPES,
    logprob_gap,
    random_model,
    random_prompts,
    save_model,
)

PLUGIN, RAW = "rlcore sglang plugin", "raw sglang.Engine"


def make_engine(path: Path, args, platform, *, cuda_graph: bool):
    from rlcore_sglang.config import SGLangConfig
    from rlcore_sglang.engine import SGLangRollout

    spec = RolloutSpec(
        model_path=str(path), dtype="bfloat16", max_model_len=1024, gpu_memory_utilization=0.5, seed=0
    )
    config = SGLangConfig(
        attention_backend=args.attention_backend,
        disable_cuda_graph=not cuda_graph,
        deterministic_inference=args.deterministic,
        weight_bucket_mib=args.bucket_mib,
    )
    return SGLangRollout(spec, config, platform)


def run_plugin(engine, prompts, params) -> float:
    start = time.perf_counter()
    out = engine.generate(prompts, params)
    return sum(len(c.token_ids) for per in out for c in per) / (time.perf_counter() - start)


def run_raw(engine, prompts, params) -> float:
    """The same requests as one batched ``async_generate`` on the engine's own loop: the call
    ``sglang.Engine.generate`` makes, without rlcore's checks, gate or result conversion."""
    from rlcore.api.requests import request_seeds
    from rlcore_sglang.sampling import to_sglang

    sampling = [to_sglang(params, request_seeds(params, i)[0]) for i in range(len(prompts))]
    with engine.exclusive() as sgl:
        start = time.perf_counter()
        out = engine.run_on_engine_loop(
            lambda: sgl.async_generate(input_ids=prompts, sampling_params=sampling, return_logprob=True)
        )
        seconds = time.perf_counter() - start
    return sum(len(o["output_ids"]) for o in out) / seconds


def flush_radix_cache(engine) -> None:
    """Empty SGLang's radix cache, so that a run never reuses the prompts' KV from the run before it
    (the two systems of a repeat share prompts: the second would skip most of its prefill)."""
    with engine.exclusive() as sgl:
        result = engine.run_on_engine_loop(lambda: sgl.tokenizer_manager.flush_cache())
    if not result.success:
        raise RuntimeError(f"SGLang refused to flush its cache: {result.message}")


def throughput(engine, batches: list[int], repeats: int, new_tokens: int) -> list[dict]:
    records = []
    funcs = {RAW: run_raw, PLUGIN: run_plugin}
    for batch in batches:
        runs: dict[str, list[float]] = {name: [] for name in funcs}
        for name in funcs:  # warm-up: kernels compiled for these shapes, allocator
            funcs[name](engine, random_prompts(batch, 0), SamplingParams(max_tokens=new_tokens, seed=0))
        for repeat in range(repeats):
            order = list(funcs) if repeat % 2 == 0 else list(funcs)[::-1]
            for name in order:
                params = SamplingParams(temperature=1.0, max_tokens=new_tokens, seed=1 + repeat)
                flush_radix_cache(engine)
                runs[name].append(funcs[name](engine, random_prompts(batch, 1 + repeat), params))
        medians = {name: statistics.median(v) for name, v in runs.items()}
        records.append(
            {
                "batch": batch,
                "tokens_per_s": medians,
                "spread_tokens_per_s": {name: [min(v), max(v)] for name, v in runs.items()},
                "runs": runs,
                "ratio_plugin_over_raw": medians[PLUGIN] / medians[RAW],
            }
        )
    return records


def weight_sync(engine, trainer, shape: str, bucket_mib: int, repeats: int, platform) -> dict:
    named = [(n, p.detach()) for n, p in trainer.named_parameters()]
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    gap_before = logprob_gap(engine, trainer)
    times = []
    for _ in range(repeats + 1):
        platform.synchronize()
        start = time.perf_counter()
        engine.load_weights(bucketize(named, bucket_mib * 2**20, dtype=torch.bfloat16))
        platform.synchronize()
        times.append(time.perf_counter() - start)
    copies = []
    dst = [torch.empty_like(t) for _, t in named]
    for _ in range(repeats + 1):
        platform.synchronize()
        start = time.perf_counter()
        for d, (_, t) in zip(dst, named, strict=True):
            d.copy_(t)
        platform.synchronize()
        copies.append(time.perf_counter() - start)
    del dst
    return {
        "shape": shape,
        "bytes": nbytes,
        "bucket_mib": bucket_mib,
        "load_weights_s": statistics.median(times[1:]),  # the first load pays for one-time allocations
        "load_weights_runs_s": times,
        "copy_floor_s": nbytes / COPY_FLOOR_BYTES_PER_S,
        "measured_copy_s": statistics.median(copies[1:]),
        "logprob_gap_before_sync": gap_before,
        "logprob_gap_after_sync": logprob_gap(engine, trainer),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bucket-mib", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--shape", default="0.5B", choices=list(SHAPES), help="model of the throughput runs")
    parser.add_argument(
        "--sync-shapes", nargs="*", default=["0.5B", "1.5B"], choices=list(SHAPES), help="none: no sync rows"
    )
    parser.add_argument("--attention-backend", default="triton")
    parser.add_argument(
        "--no-deterministic",
        dest="deterministic",
        action="store_false",
        help="sglang.deterministic_inference=false (seeds not honoured; faster kernels)",
    )
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "rlcore-bench-gpu")
    parser.add_argument("--out", type=Path, required=True, help="JSON results")
    args = parser.parse_args()
    import sglang

    platform = get_platform("cuda")
    device = torch.device("cuda")
    hardware = f"{torch.cuda.get_device_name()}, sglang {sglang.__version__}, torch {torch.__version__}"
    command = (
        f"python benchmarks/sglang_gpu.py --batch {' '.join(map(str, args.batch))} --new-tokens {args.new_tokens} "
        f"--shape {args.shape} --sync-shapes{''.join(' ' + s for s in args.sync_shapes)} --bucket-mib {args.bucket_mib} "
        f"--repeats {args.repeats} --attention-backend {args.attention_backend}"
        + ("" if args.deterministic else " --no-deterministic")
    )
    mode = f"{args.attention_backend} attention, deterministic={'on' if args.deterministic else 'off'}"
    result: dict = {
        "hardware": hardware,
        "command": command,
        "mode": mode,
        "throughput": [],
        "weight_sync": [],
    }
    rows = []

    def save() -> None:
        result["rows"] = rows
        args.out.write_text(json.dumps(result, indent=2))

    for i, shape in enumerate([args.shape, *[s for s in args.sync_shapes if s != args.shape]]):
        path = args.workdir / f"qwen2-{shape}"
        path.mkdir(parents=True, exist_ok=True)
        save_model(path, shape, device)
        platform.empty_cache()
        started = time.perf_counter()
        # Throughput runs with CUDA graphs; sync-only engines without (weights are copied in place
        # either way) to spend less device time starting them.
        engine = make_engine(path, args, platform, cuda_graph=i == 0)
        result[f"engine_start_s_{shape}"] = time.perf_counter() - started
        try:
            if i == 0:
                result["throughput"] = throughput(engine, args.batch, args.repeats, args.new_tokens)
                for rec in result["throughput"]:
                    for what, value in rec["tokens_per_s"].items():
                        low, high = rec["spread_tokens_per_s"][what]
                        rows.append(
                            f"| {what}, Qwen2.5-{shape} shape, batch {rec['batch']}, {PROMPT_LEN}+{args.new_tokens} "
                            f"tokens, sampling + logprobs, {mode} | {value:.0f} (runs {low:.0f}-{high:.0f}) | tok/s "
                            f"| {hardware} | `{command}` |"
                        )
                    rows.append(
                        f"| plugin / raw SGLang, batch {rec['batch']} | {rec['ratio_plugin_over_raw']:.3f} | x "
                        f"| {hardware} | `{command}` |"
                    )
                save()
            if shape in args.sync_shapes:
                trainer = random_model(shape, 1, device)  # the trainer's weights differ from the rollout's
                sync = weight_sync(engine, trainer, shape, args.bucket_mib, args.repeats, platform)
                del trainer
                result["weight_sync"].append(sync)
                rows.append(
                    f"| colocated weight sync {shape} ({sync['bytes'] / 2**30:.2f} GiB bf16, buckets "
                    f"{args.bucket_mib} MiB) | {sync['load_weights_s']:.3f} | s | {hardware} | `{command}` |"
                )
                rows.append(
                    f"| copy floor {shape} (bytes / 3 TB/s; measured copy_ {sync['measured_copy_s']:.4f} s) "
                    f"| {sync['copy_floor_s']:.4f} | s | {hardware} | `{command}` |"
                )
                save()
        finally:
            engine.shutdown()
            del engine
            platform.empty_cache()

    print(f"\n{hardware} ({mode})")
    for rec in result["throughput"]:
        print(
            f"batch {rec['batch']:4d}: raw {rec['tokens_per_s'][RAW]:8.0f} tok/s, plugin "
            f"{rec['tokens_per_s'][PLUGIN]:8.0f} tok/s, ratio {rec['ratio_plugin_over_raw']:.3f}"
        )
    for sync in result["weight_sync"]:
        print(
            f"sync {sync['shape']}: {sync['load_weights_s']:.3f} s for {sync['bytes'] / 2**30:.2f} GiB; floor "
            f"{sync['copy_floor_s']:.4f} s, measured copy {sync['measured_copy_s']:.4f} s; log-prob gap "
            f"{sync['logprob_gap_before_sync']:.3f} -> {sync['logprob_gap_after_sync']:.4f}"
        )
    print("\n| name | value | unit | hardware | command |\n|---|---|---|---|---|")
    print("\n".join(rows))
    save()
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""Packed (var-len) causal attention kernels on one GPU: PyTorch's flash var-len op, the one both train
engines use (``rlcore.kernels.varlen_attention``), against flash-attn-4 (``flash_attn.cute.flash_attn_varlen_func``).

For each head shape (Qwen2.5-0.5B: 14 query / 2 KV heads of 64; 1.5B: 12 / 2 of 128; 7B: 28 / 4 of 128) a
micro-batch of ``--tokens`` tokens packed from sequences of 128-1024 tokens (the training workload's
lengths, ``benchmarks/_workload.py``), bf16: forward and forward + backward, median (range) of
``--repeats`` timed calls after ``--warmup``, CUDA events; attention TFLOP/s counts the causal work
``4 * sum(L^2) / 2 * H * D`` (forward; backward 2.5x that). Each kernel's output and gradients are
compared with the other's (max abs difference). A kernel that fails (not installed, no kernel for this
GPU) is recorded with its error, never silently dropped.

    python benchmarks/attention_gpu.py --out attention.json [--tokens 16384] [--shapes 0.5B 1.5B]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch
from vllm_gpu import spread

SHAPES = {"0.5B": (14, 2, 64), "1.5B": (12, 2, 128), "7B": (28, 4, 128)}


def torch_varlen(q, k, v, cu, max_len):
    from rlcore.kernels.varlen_attention import _kernel_call

    return _kernel_call(q, k, v, cu, max_len, q.shape[-1] ** -0.5)


def fa4_varlen(q, k, v, cu, max_len):
    from flash_attn.cute import flash_attn_varlen_func

    out = flash_attn_varlen_func(
        q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max_len, max_seqlen_k=max_len, causal=True
    )
    return out[0] if isinstance(out, tuple) else out


KERNELS = {"torch varlen_attn": torch_varlen, "flash-attn-4": fa4_varlen}


def packed_lengths(tokens: int, seed: int) -> list[int]:
    rng, lengths = random.Random(seed), []
    while sum(lengths) < tokens:
        lengths.append(min(rng.randint(128, 1024), tokens - sum(lengths)))
    return lengths


def timed(fn, warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    return times


def run_shape(name: str, tokens: int, warmup: int, repeats: int) -> dict:
    hq, hkv, dim = SHAPES[name]
    lengths = packed_lengths(tokens, 0)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(tokens, h, dim, device="cuda", dtype=torch.bfloat16, generator=g) for h in (hq, hkv, hkv)
    )
    grad = torch.randn(tokens, hq, dim, device="cuda", dtype=torch.bfloat16, generator=g)
    fwd_flop = 2 * sum(L * L for L in lengths) * hq * dim  # causal: half of 4 * L^2 * H * D
    record: dict = {"shape": name, "heads": [hq, hkv, dim], "tokens": tokens, "sequences": len(lengths)}
    results = {}
    for kernel, fn in KERNELS.items():
        entry: dict = {}
        try:
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            started = time.perf_counter()
            out = fn(*leaves, cu, max(lengths))
            out.backward(grad)
            torch.cuda.synchronize()
            entry["first_call_s"] = time.perf_counter() - started  # JIT compilation, for flash-attn-4
            results[kernel] = (out.detach(), *(t.grad for t in leaves))

            def forward(fn=fn, leaves=leaves):
                with torch.no_grad():
                    fn(*leaves, cu, max(lengths))

            def both(fn=fn, leaves=leaves):
                for t in leaves:
                    t.grad = None
                fn(*leaves, cu, max(lengths)).backward(grad)

            fwd, fb = timed(forward, warmup, repeats), timed(both, warmup, repeats)
            entry.update(
                forward_s=spread(fwd),
                forward_backward_s=spread(fb),
                forward_tflops=fwd_flop / statistics.median(fwd) / 1e12,
                forward_backward_tflops=3.5 * fwd_flop / statistics.median(fb) / 1e12,
            )
        except Exception as exc:  # noqa: BLE001 -- recorded: "flash-attn-4 does not run here" is a result
            entry["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        record[kernel] = entry
        print(name, kernel, json.dumps(entry), flush=True)
    if len(results) == 2:
        (a, *ga), (b, *gb) = results.values()
        record["max_abs_diff"] = {
            "out": (a.float() - b.float()).abs().max().item(),
            **{
                f"d{n}": (x.float() - y.float()).abs().max().item()
                for n, x, y in zip("qkv", ga, gb, strict=True)
            },
        }
        base, other = (record[k] for k in KERNELS)
        record["fa4_speedup_forward_backward"] = (
            base["forward_backward_s"]["median"] / other["forward_backward_s"]["median"]
        )
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--shapes", nargs="+", default=["0.5B", "1.5B"], choices=list(SHAPES))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    result = {
        "hardware": f"{torch.cuda.get_device_name()}, torch {torch.__version__}",
        "command": "python benchmarks/attention_gpu.py " + " ".join(sys.argv[1:]),
        "shapes": [],
    }
    for name in args.shapes:
        result["shapes"].append(run_shape(name, args.tokens, args.warmup, args.repeats))
        args.out.write_text(json.dumps(result, indent=2))  # after every shape: a later failure keeps these


if __name__ == "__main__":
    main()

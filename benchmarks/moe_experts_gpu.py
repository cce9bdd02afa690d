"""Mixture-of-experts expert computation without Transformer Engine: the alternatives, on one GPU.

A layer of Qwen3-30B-A3B's experts (``--experts 128`` SwiGLU experts of ``--ffn 768`` over hidden
``--hidden 2048``, each token routed to ``--top-k 8``) on a micro-batch of ``--tokens`` tokens, bf16,
forward and backward (the gradient of the input and of every expert's weights), three ways:

- ``sequential``: one matmul per expert over its tokens (tokens sorted by expert), as megatron-core's
  local ``SequentialMLP`` computes them (what the megatron engine runs today without Transformer Engine);
- ``grouped_mm``: PyTorch's grouped GEMM (``torch.nn.functional.grouped_mm``, one kernel for every
  expert's matmul, offsets per expert) on stacked ``[E, h, 2F]`` / ``[E, F, h]`` weights;
- ``padded_bmm``: every expert's tokens padded to the busiest expert's count, one ``bmm``.

Routing is drawn at random with a skew (``--skew``: expert popularity ~ Zipf), so experts get unequal
token counts, as real routers give them. Reports the median (min-max) of ``--repeats`` timed calls after
``--warmup``, CUDA events, and TFLOP/s of the expert matmuls (``6 * tokens * top_k * 3 * hidden * ffn``
for forward + backward); outputs and gradients of each variant are compared with ``sequential``'s.

    python benchmarks/moe_experts_gpu.py --out moe_experts.json
    python benchmarks/moe_experts_gpu.py --tiny --out /tmp/moe.json   # CPU smoke test (fp32)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def routing(tokens: int, experts: int, top_k: int, skew: float, gen: torch.Generator) -> torch.Tensor:
    """``[tokens, top_k]`` distinct experts per token, popularity ``1 / rank**skew``."""
    weights = 1.0 / torch.arange(1, experts + 1, dtype=torch.float64) ** skew
    weights = weights[torch.randperm(experts, generator=gen)]
    return torch.multinomial(weights.expand(tokens, -1), top_k, replacement=False, generator=gen)


def sorted_inputs(x: torch.Tensor, chosen: torch.Tensor, experts: int):
    """Token copies sorted by expert ``[T*k, h]`` and the count per expert."""
    flat = chosen.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=experts)
    return x.repeat_interleave(chosen.shape[1], dim=0)[order], counts


def swiglu(h: torch.Tensor) -> torch.Tensor:
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


def sequential(xs, counts, w1, w2):
    outs, start = [], 0
    for e, n in enumerate(counts.tolist()):
        if n:
            outs.append(swiglu(xs[start : start + n] @ w1[e]) @ w2[e])
        start += n
    return torch.cat(outs)


def grouped_mm(xs, counts, w1, w2):
    offs = torch.cumsum(counts, 0).to(torch.int32)
    return F.grouped_mm(swiglu(F.grouped_mm(xs, w1, offs=offs)), w2, offs=offs)


def padded_bmm(xs, counts, w1, w2):
    experts, most = len(counts), int(counts.max())
    slot = torch.arange(len(xs), device=xs.device) - torch.repeat_interleave(
        torch.cumsum(counts, 0) - counts, counts
    )
    expert = torch.repeat_interleave(torch.arange(experts, device=xs.device), counts)
    padded = xs.new_zeros(experts, most, xs.shape[1]).index_put((expert, slot), xs)
    out = torch.bmm(swiglu(torch.bmm(padded, w1)), w2)
    return out[expert, slot]


VARIANTS = {"sequential": sequential, "grouped_mm": grouped_mm, "padded_bmm": padded_bmm}


def timed(fn, device, repeats: int, warmup: int) -> list[float]:
    times = []
    for i in range(warmup + repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            fn()
            seconds = time.perf_counter() - t0
        if i >= warmup:
            times.append(seconds)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--ffn", type=int, default=768)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--skew", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test: small sizes, fp32")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.tiny:
        args.tokens, args.hidden, args.ffn, args.experts, args.top_k = 64, 32, 16, 8, 2
        args.repeats, args.warmup = 2, 1
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(0)
    chosen = routing(args.tokens, args.experts, args.top_k, args.skew, gen).to(device)
    x = (torch.randn(args.tokens, args.hidden, generator=gen) * 0.5).to(device, dtype)
    w1 = (torch.randn(args.experts, args.hidden, 2 * args.ffn, generator=gen) * 0.02).to(device, dtype)
    w2 = (torch.randn(args.experts, args.ffn, args.hidden, generator=gen) * 0.02).to(device, dtype)
    xs, counts = sorted_inputs(x, chosen, args.experts)
    grad = torch.randn(len(xs), args.hidden, generator=gen).to(device, dtype)
    flops = 6 * len(xs) * 3 * args.hidden * args.ffn

    results, reference = {}, None
    for name, fn in VARIANTS.items():
        leaves = [t.detach().clone().requires_grad_() for t in (xs, w1, w2)]

        def step(fn=fn, leaves=leaves):
            for t in leaves:
                t.grad = None
            out = fn(leaves[0], counts, leaves[1], leaves[2])
            out.backward(grad)
            return out

        try:
            out = step()
            got = [out.detach().float(), *(t.grad.float() for t in leaves)]
            times = timed(step, device, args.repeats, args.warmup)
        except Exception as exc:  # a variant without a kernel here is recorded, not dropped
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"{name:12s} failed: {exc}")
            continue
        if reference is None:
            reference = got
        diffs = [float((a - b).abs().max()) for a, b in zip(got, reference, strict=True)]
        median = statistics.median(times)
        results[name] = {
            "seconds_median": median,
            "seconds_range": [min(times), max(times)],
            "tflops": flops / median / 1e12,
            "max_abs_diff_vs_sequential": dict(
                zip(("out", "grad_x", "grad_w1", "grad_w2"), diffs, strict=True)
            ),
        }
        print(f"{name:12s} {median * 1e3:8.2f} ms  ({min(times) * 1e3:.2f}-{max(times) * 1e3:.2f})  "
              f"{flops / median / 1e12:6.1f} TFLOP/s  max diff vs sequential {max(diffs):.2e}")  # fmt: skip
    report = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "tokens_per_expert": {
            "min": int(counts.min()),
            "max": int(counts.max()),
            "mean": float(counts.float().mean()),
        },
        "results": results,
    }
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

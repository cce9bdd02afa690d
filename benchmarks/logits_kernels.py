"""Device time of the FSDP engine's log-prob head kernels on one chunk of logits, by formulation.

The head (``rlcore.kernels.logits``) makes two vocabulary-wide elementwise passes per chunk of ``c`` tokens:
the statistics (log-partition, target log-prob, entropy) in the forward, and ``dL/dlogits`` in the
backward. Both are memory-bound: their floor is the time to read the ``[c, V]`` bf16 logits (and, for
the gradient, write as many bytes). Variants (``--variants``):

- ``eager``: ``_stats`` and the in-place ``_grad_logits`` without the compiler (``fsdp.compile: false``);
- ``compiled-dynamic``: both through ``torch.compile(dynamic=True)``, as the engine did before: the
  vocabulary size is symbolic too;
- ``compiled-in-place``: automatic-dynamic shapes (only the chunk length symbolic), the gradient still
  in its in-place form with a scatter;
- ``compiled``: the engine's kernels now (``_compiled_kernels``): automatic-dynamic shapes and the
  gradient in its scatter-free functional form.

Each compiled variant first sees two other chunk lengths, as in training (the last chunk of a micro-batch
is shorter), so the timed call runs the shape-generic kernel. ``max_err`` is the largest absolute
difference from float64 eager on the same bf16 logits. The floor row is a copy that reads and writes
the logits once (``clone``).

GPU::

    python benchmarks/logits_kernels.py --out logits_kernels.json

CPU smoke test::

    python benchmarks/logits_kernels.py --tokens 64 --vocab 1000 --variants eager --out /tmp/lk.json
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import torch
from rlcore.devices import get_platform
from rlcore.kernels import logits as head

VARIANTS = ("eager", "compiled-dynamic", "compiled-in-place", "compiled")


def kernels(variant: str):
    """``(statistics, gradient)`` functions of ``variant``."""
    if variant == "eager":
        return head._stats, head._grad_logits
    if variant == "compiled-dynamic":
        return torch.compile(head._stats, dynamic=True), torch.compile(head._grad_logits, dynamic=True)
    if variant == "compiled-in-place":
        return torch.compile(head._stats), torch.compile(head._grad_logits)
    return head._compiled_kernels()


def timed_ms(fn, platform, repeats: int) -> float:
    for _ in range(3):
        fn()
    platform.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    platform.synchronize()
    return (time.perf_counter() - start) / repeats * 1e3


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=4096, help="chunk length c (fsdp.logits_chunk_size)")
    p.add_argument("--vocab", type=int, default=151936, help="V (Qwen2.5's by default)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--device", default="auto", help="rlcore device platform name")
    p.add_argument("--out", required=True, help="JSON file for the results")
    args = p.parse_args(argv)

    platform = get_platform(args.device)
    device = platform.set_device(0)
    g = torch.Generator(device=device).manual_seed(0)
    c, V, T = args.tokens, args.vocab, args.temperature
    logits = (3 * torch.randn(c, V, device=device, generator=g)).bfloat16()
    targets = torch.randint(0, V, (c,), device=device, generator=g)
    g_lp, g_ent = torch.randn(2, c, device=device, generator=g)
    want_stats = head._stats(logits.double(), targets, T)
    lse, entropy = want_stats[2].float(), want_stats[1].float()
    want_grad = head._grad_logits(
        logits.double(), targets, lse.double(), entropy.double(), g_lp.double(), g_ent.double(), T
    )
    read = logits.numel() * logits.element_size()

    rows = [{"kernel": "floor (clone)", "variant": "-", "ms": timed_ms(logits.clone, platform, args.repeats)}]
    rows[0]["gb_per_s"] = 2 * read / rows[0]["ms"] / 1e6
    for variant in args.variants:
        stats, grad = kernels(variant)
        for n in (c // 3, c // 2):  # other chunk lengths first, as a training step brings them
            stats(logits[:n], targets[:n], T)
            grad(logits[:n], targets[:n], lse[:n], entropy[:n], g_lp[:n], g_ent[:n], T)
        got_stats = stats(logits, targets, T)
        got_grad = grad(logits, targets, lse, entropy, g_lp, g_ent, T)
        runs = {
            "statistics": (
                functools.partial(stats, logits, targets, T),
                read,
                max(float((a.double() - b).abs().max()) for a, b in zip(got_stats, want_stats, strict=True)),
            ),
            "gradient": (
                functools.partial(grad, logits, targets, lse, entropy, g_lp, g_ent, T),
                2 * read,
                float((got_grad.double() - want_grad).abs().max()),
            ),
        }
        for kernel, (fn, nbytes, err) in runs.items():
            ms = timed_ms(fn, platform, args.repeats)
            rows.append(
                {
                    "kernel": kernel,
                    "variant": variant,
                    "ms": ms,
                    "gb_per_s": nbytes / ms / 1e6,
                    "max_err": err,
                }
            )

    print(f"[{c}, {V}] bf16 logits on {platform.name}")
    print(f"{'kernel':<14} {'variant':<17} {'ms':>8} {'GB/s':>8} {'max_err':>9}")
    for r in rows:
        err = f"{r['max_err']:.1e}" if "max_err" in r else "-"
        print(f"{r['kernel']:<14} {r['variant']:<17} {r['ms']:>8.3f} {r['gb_per_s']:>8.0f} {err:>9}")
    env = {"torch": torch.__version__, "device": platform.name}
    if platform.device_type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(0)
    Path(args.out).write_text(json.dumps({"environment": env, "args": vars(args), "results": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

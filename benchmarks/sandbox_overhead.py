"""Per-call overhead of the local sandbox: the layer set before reads were restricted against today's
defaults, side by side in one run (calls interleaved, so both see the same machine load).

    .venv/bin/python benchmarks/sandbox_overhead.py --calls 50

``before``: network, pid and mount namespaces, Landlock on writes (and TCP, signals), a pids cgroup,
the guard where needed, the caller's uid (``user=None, mountns="off", seccomp="off", reads=False``).
``after``: the defaults: the same plus the minimal read-only root, Landlock on reads, the drop to
``nobody`` without capabilities and the seccomp filter. Each call runs ``pass``; the time is the call
as its caller sees it (``SandboxResult.wall_s``). Prints the median, the 10th/90th percentiles and the
ratio of medians; ``--json`` writes them too. ``--git-ref HEAD`` adds a third column: the local
sandbox's code (``local.py``, ``_child.py``) as of that commit, at its defaults. Results are in
``docs/security.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rlcore.sandbox.local import LocalSandbox

CONFIGS = {
    "before": {"user": None, "mountns": "off", "seccomp": "off", "reads": False},
    "after": {},
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def sandbox_at(ref: str) -> Any:
    """``LocalSandbox()`` built from the ``local.py`` and ``_child.py`` of git commit ``ref``."""
    root = Path(__file__).resolve().parents[1]
    folder = Path(tempfile.mkdtemp(prefix="rlcore-sandbox-at-"))
    for name in ("local.py", "_child.py"):
        text = subprocess.run(
            ["git", "show", f"{ref}:core/rlcore/sandbox/{name}"],
            cwd=root,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        (folder / name).write_text(text)
    spec = importlib.util.spec_from_file_location(f"sandbox_at_{ref}", folder / "local.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.LocalSandbox()


def measure(calls: int, warmup: int = 3, ref: str | None = None) -> dict[str, dict[str, Any]]:
    boxes = {name: LocalSandbox(**options) for name, options in CONFIGS.items()}
    if ref:
        boxes[ref] = sandbox_at(ref)
    times: dict[str, list[float]] = {name: [] for name in boxes}
    for i in range(warmup + calls):
        for name, box in boxes.items():
            result = box.run_sync("pass")
            if result.status != "ok":
                raise SystemExit(f"{name}: a trivial call failed: {result}")
            if i >= warmup:
                times[name].append(result.wall_s * 1000)
    layers = {name: box.isolation().get("layers", {}) for name, box in boxes.items()}
    held = {
        name: sorted(k for k, v in found.items() if v["held"]) or ["(not reported)"]
        for name, found in layers.items()
    }
    return {
        name: {
            "median_ms": statistics.median(ms),
            "p10_ms": percentile(ms, 0.1),
            "p90_ms": percentile(ms, 0.9),
            "min_ms": min(ms),
            "max_ms": max(ms),
            "calls": len(ms),
            "layers_held": held[name],
        }
        for name, ms in times.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50, help="calls per configuration (default 50)")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--git-ref", help="also time the local sandbox's code at this commit (e.g. HEAD)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    results = measure(args.calls, ref=args.git_ref)
    ratio = results["after"]["median_ms"] / results["before"]["median_ms"]
    for name, r in results.items():
        print(
            f"{name:<7} median {r['median_ms']:6.1f} ms  p10 {r['p10_ms']:6.1f}  p90 {r['p90_ms']:6.1f}  "
            f"min {r['min_ms']:6.1f}  max {r['max_ms']:6.1f}  ({r['calls']} calls)  layers: {', '.join(r['layers_held'])}"
        )
    print(
        f"after / before (medians): {ratio:.2f}x   [{time.monotonic() - start:.0f} s, {platform.platform()}]"
    )
    if args.git_ref:
        against = results["after"]["median_ms"] / results[args.git_ref]["median_ms"]
        print(f"after / {args.git_ref} (medians): {against:.2f}x")
    if args.json:
        args.json.write_text(
            json.dumps({"results": results, "ratio": ratio, "python": sys.version}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

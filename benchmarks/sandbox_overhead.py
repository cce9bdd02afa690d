"""Per-call overhead of the local sandbox: the layer set before reads were restricted against today's
defaults, side by side in one run (calls interleaved, so both see the same machine load).

    .venv/bin/python benchmarks/sandbox_overhead.py --calls 50

``before``: network, pid and mount namespaces, Landlock on writes (and TCP, signals), a pids cgroup,
the guard where needed, the caller's uid (``user=None, mountns="off", seccomp="off", reads=False``).
``after``: the defaults: the same plus the minimal read-only root, Landlock on reads, the drop to
``nobody`` without capabilities and the seccomp filter. Each call runs ``pass``; the time is the call
as its caller sees it (``SandboxResult.wall_s``). Prints the median, the 10th/90th percentiles and the
ratio of medians; ``--json`` writes them too. ``--git-ref REF`` adds a third column: rlcore's code as
of that commit (``git archive``; the whole package, so the sandbox's modules match each other), at its
defaults, run by a helper process on the same machine, its calls interleaved with the others. Results
are in ``docs/benchmarks.md`` and ``docs/security.md``.
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import statistics
import subprocess
import sys
import tarfile
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


_DRIVER = """
import json, sys
from rlcore.sandbox.local import LocalSandbox
box = LocalSandbox()
for line in sys.stdin:
    result = box.run_sync(line.strip() and json.loads(line)["code"])
    print(json.dumps({"status": result.status, "wall_s": result.wall_s, "message": result.message,
                      "layers": result.isolation.get("layers", {})}), flush=True)
"""


class SandboxAt:
    """``LocalSandbox()`` of rlcore as of git commit ``ref``, in a helper process: ``run_sync`` sends it
    one call and returns ``(status, wall_s, message, layers)``."""

    def __init__(self, ref: str):
        root = Path(__file__).resolve().parents[1]
        self.folder = Path(tempfile.mkdtemp(prefix="rlcore-at-"))
        archive = subprocess.run(
            ["git", "archive", ref, "core/rlcore"], cwd=root, check=True, capture_output=True
        )
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(self.folder, filter="data")
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(self.folder / "core"), "LANG": "C.UTF-8"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )

    def run_sync(self, code: str) -> tuple[str, float, str, dict]:
        self.proc.stdin.write(json.dumps({"code": code}) + "\n")
        self.proc.stdin.flush()
        out = json.loads(self.proc.stdout.readline())
        return out["status"], out["wall_s"], out["message"], out["layers"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        subprocess.run(["rm", "-rf", str(self.folder)], check=False)


def _call(box: Any, code: str) -> tuple[str, float, str, dict]:
    if isinstance(box, SandboxAt):
        return box.run_sync(code)
    result = box.run_sync(code)
    return result.status, result.wall_s, result.message, result.isolation.get("layers", {})


def measure(calls: int, warmup: int = 3, ref: str | None = None) -> dict[str, dict[str, Any]]:
    boxes: dict[str, Any] = {name: LocalSandbox(**options) for name, options in CONFIGS.items()}
    if ref:
        boxes[ref] = SandboxAt(ref)
    times: dict[str, list[float]] = {name: [] for name in boxes}
    layers: dict[str, dict] = {}
    try:
        for i in range(warmup + calls):
            for name, box in boxes.items():
                status, wall_s, message, layers[name] = _call(box, "pass")
                if status != "ok":
                    raise SystemExit(f"{name}: a trivial call failed: {status}: {message}")
                if i >= warmup:
                    times[name].append(wall_s * 1000)
    finally:
        for box in boxes.values():
            if isinstance(box, SandboxAt):
                box.close()
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
    parser.add_argument("--git-ref", help="also time rlcore's local sandbox as of this commit (e.g. HEAD~1)")
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
        record = {"results": results, "ratio": ratio, "python": sys.version, "platform": platform.platform()}
        if args.git_ref:
            record["git_ref"] = args.git_ref
            record["ratio_vs_ref"] = results["after"]["median_ms"] / results[args.git_ref]["median_ms"]
        record["command"] = " ".join(["benchmarks/sandbox_overhead.py", *(argv or sys.argv[1:])])
        args.json.write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

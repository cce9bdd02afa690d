"""What the benchmark scripts say about the CPU they ran on (their rows' hardware column)."""

from __future__ import annotations

import platform


def cpu_name(default: str | None = None) -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (Linux), else ``default`` or what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return default or platform.processor() or platform.machine()

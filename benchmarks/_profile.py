"""Where a benchmark step's device time goes: ``torch.profiler`` tables and the device's idle gaps.

Used by ``fsdp_train.py`` and ``megatron_gpu.py`` (``--profile DIR``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch


def profile_call(fn: Callable[[], object], path: str, write: bool = True) -> None:
    """Run ``fn`` under ``torch.profiler``; if ``write``, save to ``path`` the operators by device (else
    CPU) time, then by host time, after where the device sat idle (:func:`device_idle`). Every rank of a
    collective step must call it; one writes."""
    from torch.profiler import profile, supported_activities

    with profile(activities=supported_activities()) as prof:
        fn()
    device = torch.accelerator.current_accelerator()
    key = f"self_{device.type}_time_total" if device is not None else "self_cpu_time_total"
    if write:
        table = prof.key_averages()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(
            device_idle(prof)
            + table.table(sort_by=key, row_limit=40, max_name_column_width=60)
            + "\n\nBy host time:\n"
            + table.table(sort_by="cpu_time_total", row_limit=40, max_name_column_width=60)
        )


def device_idle(prof, gaps: int = 12) -> str:
    """The profiled step's wall time, the device's busy time (the union of its kernels, copies and sets)
    and its longest idle gaps, each with the host operators running then (innermost first) and the
    kernel that ended the gap: what a step spends outside device work. Empty on a CPU."""
    from torch.autograd import DeviceType

    events = list(prof.profiler.kineto_results.events())
    work = sorted(
        (e.start_ns(), e.end_ns(), e.name())
        for e in events
        if e.device_type() != DeviceType.CPU and not e.is_user_annotation() and e.duration_ns() > 0
    )
    if not work:
        return ""
    host = [(e.start_ns(), e.end_ns(), e.name()) for e in events if e.device_type() == DeviceType.CPU]
    begin, end = min(h[0] for h in host), max(max(h[1] for h in host), work[-1][1])
    idle, busy, cursor = [], 0, begin
    for start, stop, name in work:
        if start > cursor:
            idle.append((start - cursor, cursor, name))
        if stop > cursor:
            busy += stop - max(start, cursor)
            cursor = stop
    if end > cursor:
        idle.append((end - cursor, cursor, "(end of step)"))
    lines = [
        f"Device idle: {(end - begin - busy) / 1e6:.1f} ms of a {(end - begin) / 1e6:.1f} ms step "
        f"({100 * (end - begin - busy) / (end - begin):.1f}%), in {len(idle)} gaps; the longest:"
    ]
    for length, at, after in sorted(idle, reverse=True)[:gaps]:
        middle = at + length // 2
        running = sorted((h[1] - h[0], h[2]) for h in host if h[0] <= middle < h[1])
        ops = " < ".join(name for _, name in running[:4]) or "-"
        lines.append(
            f"  {length / 1e6:8.2f} ms at +{(at - begin) / 1e6:8.1f} ms, host in: {ops}; then {after[:60]}"
        )
    return "\n".join(lines) + "\n\n"

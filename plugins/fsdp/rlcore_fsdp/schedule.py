"""The learning-rate schedule: linear warm-up, then constant or cosine decay."""

from __future__ import annotations

import math

SCHEDULES = ("constant", "cosine")


def check_schedule(schedule: str, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> None:
    """Reject settings :func:`lr_factor` cannot honour, naming the ``EngineSpec`` field."""
    if schedule not in SCHEDULES:
        raise ValueError(f"EngineSpec.lr_schedule must be one of {SCHEDULES}, got {schedule!r}")
    if warmup_steps < 0:
        raise ValueError(f"EngineSpec.warmup_steps must be >= 0, got {warmup_steps}")
    if schedule == "cosine" and total_steps <= warmup_steps:
        raise ValueError(
            f"EngineSpec.lr_schedule='cosine' decays from warm-up to total_steps, so total_steps "
            f"({total_steps}) must exceed warmup_steps ({warmup_steps})"
        )
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"EngineSpec.min_lr_ratio must be in [0, 1], got {min_lr_ratio}")


def lr_factor(step: int, schedule: str, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the base learning rate for optimizer step ``step`` (0 for the first step).

    Warm-up: ``(step + 1) / warmup_steps`` for ``step < warmup_steps``, so the first step already moves.
    Cosine: ``min + (1 - min) * (1 + cos(pi * p)) / 2`` with ``p = (step - warmup) / (total - warmup)``
    clipped to 1, reaching ``min_lr_ratio`` at ``total_steps`` and staying there.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

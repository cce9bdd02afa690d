"""The end-of-run picture: reward, validation reward, KL and response length against the step.

Drawn with matplotlib's Agg backend (no display needed) from the run's metrics history, the records
that ``metrics.jsonl`` holds.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PLOT_FILE = "curves.png"

#: One panel per entry: title, and the metric keys it draws (the first key present in the history is
#: used; KL is to the reference policy, as a loss term or a reward penalty, or without a reference
#: model the old-to-new policy KL of the updates).
PANELS = (
    ("reward (train)", ("reward/mean",)),
    ("reward (validation)", ("val/reward",)),
    ("KL", ("actor/kl_loss", "actor/reward_kl_penalty", "actor/ppo_kl")),
    ("response length", ("response_length/mean",)),
)
#: Points drawn over a panel's line when present: panel title -> ((key, label), ...).
OVERLAYS = {"reward (validation)": (("val/reward_after_sft", "after the SFT warm-up"),)}


def series(history: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of ``key`` over the records that have a finite value for it."""
    steps, values = [], []
    for record in history:
        value = record.get(key)
        if isinstance(value, int | float) and value == value:  # skips None and NaN
            steps.append(int(record["step"]))
            values.append(float(value))
    return steps, values


def plot_curves(history: Sequence[Mapping[str, Any]], path: str | os.PathLike, title: str = "") -> Path:
    """Write a 2x2 PNG of :data:`PANELS` to ``path``; a panel with no data says so."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 7), dpi=100)
    axes = fig.subplots(2, 2).flatten()
    for ax, (name, keys) in zip(axes, PANELS, strict=True):
        key = next((k for k in keys if series(history, k)[0]), None)
        ax.set_title(name if key is None else f"{name}: {key}", fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if key is None:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
            continue
        steps, values = series(history, key)
        ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=key)
        overlays = [(series(history, k), label) for k, label in OVERLAYS.get(name, ())]
        for (x, y), label in overlays:
            if x:
                ax.plot(x, y, linestyle="none", marker="*", markersize=10, label=label)
        if any(x for (x, _), _ in overlays):
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path

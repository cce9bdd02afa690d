"""The end-of-run picture: reward, validation reward, KL, response length and the rollout/trainer
mismatch against the step.

Drawn with matplotlib's Agg backend (no display needed) from the run's metrics history, the records
that ``metrics.jsonl`` holds.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PLOT_FILE = "curves.png"

GAP = "rollout vs trainer |log-prob difference|"
MISMATCH = "rollout vs trainer: KL(rollout || trainer), k3"
#: One panel per entry: title, and the metric keys it draws (the first key present in the history is
#: used; KL is to the distillation teacher in an on-policy distillation run, else to the reference policy,
#: as a loss term or a reward penalty, or without a reference model the old-to-new policy KL of the updates). The mismatch panels take the batch's numbers, which
#: every step records (:mod:`rlcore.algorithms.mismatch`), else the post-sync check's.
PANELS = (
    ("reward (train)", ("reward/mean",)),
    ("reward (validation)", ("val/reward",)),
    ("KL", ("distill/reverse_kl", "actor/kl_loss", "actor/reward_kl_penalty", "actor/ppo_kl")),
    ("response length", ("response_length/mean",)),
    (GAP, ("rollout/logprob_diff_mean", "sync/logprob_diff_mean")),
    (MISMATCH, ("rollout/mismatch_k3_kl", "sync/mismatch_k3_kl")),
)
#: More lines in a panel, each drawn where the history has it: panel title -> ((key, label), ...). The
#: quantiles need the whole batch at once, so a step without the old-log-prob pass has them only from
#: the post-sync check.
LINES = {
    GAP: tuple(
        (f"{source}/logprob_diff_{stat}", f"{stat} ({what})")
        for source, what in (("rollout", "batch"), ("sync", "post-sync check"))
        for stat in ("p50", "p90", "p99", "max", "trimmed")
    )
    + (("sync/bound", "bound (post-sync check)"),),
}
#: Points drawn over a panel's line when present: panel title -> ((key, label), ...).
OVERLAYS = {"reward (validation)": (("val/reward_after_sft", "after the SFT warm-up"),)}
#: Series on a second y-axis (ratios and shares, near 1 or between 0 and 1, where the k3 KL is near 0):
#: panel title -> ((key, label), ...); each present is drawn, dashed.
RIGHT_AXIS = {
    MISMATCH: tuple(
        (f"{source}/{key}", f"{label}{what}")
        for source, what in (("rollout", ""), ("sync", " (post-sync check)"))
        for key, label in (
            ("mismatch_ppl_ratio", "PPL ratio trainer / rollout"),
            ("mismatch_seq_ratio_max", "largest sequence weight"),
            ("mismatch_seq_over_cap", "share of sequences over 3"),
        )
    )
}


def series(history: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of ``key`` over the records that have a finite value for it."""
    steps, values = [], []
    for record in history:
        value = record.get(key)
        if isinstance(value, int | float) and value == value:  # skips None and NaN
            steps.append(int(record["step"]))
            values.append(float(value))
    return steps, values


def _marker(steps: Sequence[int]) -> str | None:
    """Dots on a line of few points (the post-sync check's every tenth step), none on a dense one."""
    return "o" if len(steps) < 30 else None


def plot_curves(history: Sequence[Mapping[str, Any]], path: str | os.PathLike, title: str = "") -> Path:
    """Write a 2x3 PNG of :data:`PANELS` to ``path``; a panel with no data says so."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 7), dpi=100)
    axes = fig.subplots(2, 3).flatten()
    for ax, (name, keys) in zip(axes, PANELS, strict=True):
        key = next((k for k in keys if series(history, k)[0]), None)
        ax.set_title(name if key is None else f"{name}: {key}", fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if key is None:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
            continue
        for k, label in ((key, key), *((k, lb) for k, lb in LINES.get(name, ()) if k != key)):
            x, y = series(history, k)
            if x:
                ax.plot(x, y, marker=_marker(x), markersize=3, label=label)
        for k, label in OVERLAYS.get(name, ()):
            x, y = series(history, k)
            if x:
                ax.plot(x, y, linestyle="none", marker="*", markersize=10, label=label)
        handles, labels = ax.get_legend_handles_labels()
        rights = [kl for kl in RIGHT_AXIS.get(name, ()) if series(history, kl[0])[0]]
        if rights:
            twin = ax.twinx()
            for key_right, label in rights:
                x, y = series(history, key_right)
                (line,) = twin.plot(x, y, linestyle="--", marker=_marker(x), markersize=3)
                handles, labels = [*handles, line], [*labels, label]
            twin.set_ylabel("ratio / share", fontsize=8)
        if len(handles) > 1:  # one legend for both y-axes
            ax.legend(handles, labels, fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path

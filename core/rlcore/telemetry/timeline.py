"""The run's timeline: each phase of each role as an interval, in ``<run dir>/timeline.jsonl``, and the
picture of it, ``timeline.png``.

One JSON line per interval and rank: ``{"start", "end"`` (seconds since the run's trainer started),
``"phase", "role", "rank", "step", "version"}``. ``step`` is the training step the work belongs to (the
batch a generation produces trains step ``step``), ``version`` the policy version of the weights it ran
with. Times are the driver's: a phase starts when the controller sends it and ends when the last rank
answers, so every rank of a role shows the same interval. A synchronous run shows the roles taking
turns; an overlapping one shows the rollout generating under the actor's updates.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

TIMELINE_FILE = "timeline.jsonl"
TIMELINE_PLOT = "timeline.png"

#: The role(s) each phase runs on; phases not listed run on the driver.
PHASE_ROLES: dict[str, tuple[str, ...]] = {
    "generate": ("rollout",),
    "validate": ("rollout",),
    "score": ("reward",),
    "old_log_probs": ("actor",),
    "update_actor": ("actor",),
    "ref_log_probs": ("reference",),
    "values": ("critic",),
    "update_critic": ("critic",),
    "sync_weights": ("actor", "rollout"),
}


class Timeline:
    """Appends intervals to ``path`` (``None``: kept in memory only), from any thread.

    ``ranks`` gives each role's rank count (a role missing from it has one rank).
    """

    def __init__(self, path: str | os.PathLike | None, ranks: Mapping[str, int] | None = None):
        self.path = None if path is None else Path(path)
        self.ranks = dict(ranks or {})
        self.origin = time.perf_counter()
        self.intervals: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def record(self, phase: str, start: float, end: float, step: int, version: int | None) -> None:
        """One phase from ``start`` to ``end`` (``time.perf_counter()`` values)."""
        rows = []
        for role in PHASE_ROLES.get(phase, ("driver",)):
            for rank in range(self.ranks.get(role, 1)):
                rows.append(
                    {
                        "start": round(start - self.origin, 6),
                        "end": round(end - self.origin, 6),
                        "phase": phase,
                        "role": role,
                        "rank": rank,
                        "step": step,
                        "version": version,
                    }
                )
        with self._lock:
            self.intervals += rows
            if self.path is not None:
                with self.path.open("a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in rows)


def read_timeline(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The intervals of a ``timeline.jsonl``."""
    with Path(path).open() as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_timeline(
    intervals: Sequence[Mapping[str, Any]],
    path: str | os.PathLike,
    title: str = "",
    last_s: float | None = None,
) -> Path:
    """Draw one row per role and rank, a bar per phase (coloured by phase, labelled by step), to ``path``.
    ``last_s``: only the final seconds of the run (the steady state, warm-up excluded)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted({(r["role"], r["rank"]) for r in intervals}, key=lambda x: (_ROLE_ORDER.get(x[0], 9), x))
    phases = sorted({r["phase"] for r in intervals})
    colours = {p: plt.get_cmap("tab10")(i % 10) for i, p in enumerate(phases)}
    end = max((r["end"] for r in intervals), default=0.0)
    begin = 0.0 if last_s is None else max(0.0, end - last_s)
    fig, ax = plt.subplots(figsize=(12, 0.5 * len(rows) + 1.6))
    for y, (role, rank) in enumerate(rows):
        for r in intervals:
            if (r["role"], r["rank"]) != (role, rank) or r["end"] < begin:
                continue
            ax.barh(
                y,
                r["end"] - r["start"],
                left=r["start"],
                color=colours[r["phase"]],
                edgecolor="black",
                lw=0.3,
            )
            if r["end"] - r["start"] > (end - begin) / 60:
                ax.text((r["start"] + r["end"]) / 2, y, str(r["step"]), ha="center", va="center", fontsize=6)
    ax.set_yticks(range(len(rows)), [f"{role} {rank}" for role, rank in rows])
    ax.invert_yaxis()
    ax.set_xlim(begin, end)
    ax.set_xlabel("seconds since the trainer started (bar labels: the training step)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[p]) for p in phases]
    ax.legend(
        handles, phases, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=min(len(phases), 6), fontsize=8
    )
    return _save(fig, ax, path, title)


_ROLE_ORDER = {"rollout": 0, "reward": 1, "actor": 2, "reference": 3, "critic": 4, "driver": 5}


REQUESTS_PLOT = "stream.png"


def plot_requests(lines: Sequence[Mapping[str, Any]], path: str | os.PathLike, title: str = "") -> Path:
    """The stream's requests across steps, from ``stream.jsonl`` (:mod:`rlcore.stream`): one line per group
    from its admission to the step that trained (or dropped) it, a dot where it finished, coloured by
    outcome; dashed lines where steps ended. A group whose line crosses a dashed line lived across steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"trained": "tab:blue", "stale": "tab:red", "filtered": "tab:grey"}
    fig, ax = plt.subplots(figsize=(12, 4.5))
    for line in lines:
        y, colour = line["seq"], colours.get(line["outcome"], "black")
        ax.plot([line["admitted_at"], line["left_at"]], [y, y], color=colour, lw=1)
        if line.get("finished_at") is not None:
            ax.plot([line["finished_at"]], [y], ".", color=colour, ms=3)
    ends: dict[int, float] = {}
    for line in lines:
        ends[line["left_step"]] = max(ends.get(line["left_step"], 0.0), line["left_at"])
    for end in ends.values():
        ax.axvline(end, color="black", ls="--", lw=0.5)
    ax.set_xlabel("seconds since the trainer started (dashed: a step's batch taken; dot: the group finished)")
    ax.set_ylabel("group (admission order)")
    handles = [plt.Line2D([0], [0], color=c) for c in colours.values()]
    ax.legend(handles, list(colours), loc="upper left", fontsize=8)
    return _save(fig, ax, path, title)


def _save(fig: Any, ax: Any, path: str | os.PathLike, title: str) -> Path:
    import matplotlib.pyplot as plt

    if title:
        ax.set_title(title)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out

"""Which prompts each step trained on, and under which policy versions: ``<run dir>/trained_samples.jsonl``.

One line per training step: ``{"step", "version"`` (the policy version the update started from),
``"index"`` (per trained row, its prompt's position in the training data; rows of a group repeat it),
``"oldest", "newest"`` (per row, the oldest and newest policy version among its sampled tokens; both
``version`` where the rollout records none: a synchronous step is on-policy)``}``. A resumed run drops
the lines after its checkpoint's step first, so the file lists each trained step once: the record to count
prompts trained twice or lost, and to check every sample's staleness.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rlcore.algorithms.off_policy import version_span

SAMPLES_FILE = "trained_samples.jsonl"


def trained_rows(batch: Any) -> dict[str, list]:
    """The facts :class:`TrainedSamples` keeps of a trained batch: ``index``, and with ``policy_version
    [B, R]`` in the batch each row's ``oldest``/``newest`` version over its model tokens."""
    index = batch.objects.get("index")
    rows: dict[str, list] = {"index": [None if i is None else int(i) for i in index] if index else []}
    if "policy_version" in batch:
        oldest, newest = version_span(batch["policy_version"], batch["response_mask"])
        rows["oldest"] = [
            None if n < 0 else int(o) for o, n in zip(oldest.tolist(), newest.tolist(), strict=True)
        ]
        rows["newest"] = [None if n < 0 else int(n) for n in newest.tolist()]
    return rows


class TrainedSamples:
    """Appends one line per step to ``path``, after dropping the lines of steps past ``keep_through``."""

    def __init__(self, path: str | os.PathLike, keep_through: int = 0):
        self.path = Path(path)
        if self.path.exists():
            kept = [line for line in read_samples(self.path) if line["step"] <= keep_through]
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(line) + "\n" for line in kept))
            tmp.replace(self.path)

    def write(self, step: int, version: int, rows: dict[str, list]) -> None:
        line = {"step": step, "version": version, **rows}
        for key in ("oldest", "newest"):
            line.setdefault(key, [version] * len(line.get("index", [])))
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")


def read_samples(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The lines of a ``trained_samples.jsonl``."""
    with Path(path).open() as f:
        return [json.loads(line) for line in f if line.strip()]

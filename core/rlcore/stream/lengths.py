"""The stream's bias in plain sight: lengths of what a step trained against what it generated, and how
many trained tokens each policy version sampled.

Taking groups as they finish favours short responses (a long group is still generating when the short
ones are taken), and carried groups are trained later, under staler weights. These metrics show both:

- ``stream/length/trained_mean|p50|p90``: response lengths of the trained groups;
- ``stream/length/finished_mean|p50|p90``: of every group that finished in this step's rounds, trained
  now or not (what the rollout produced);
- ``stream/length/unfinished_mean``: tokens so far of the responses still in flight at the cut (a lower
  bound on their lengths: the tail the step did not wait for);
- ``stream/tokens_lag/<k>``: the share of trained response tokens sampled ``k`` versions behind the
  weights being updated (``0``: on-policy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlcore.algorithms.mismatch import sorted_quantile


def _summary(name: str, lengths: list[int]) -> dict[str, float]:
    if not lengths:
        return {}
    ordered = sorted(lengths)
    return {
        f"stream/length/{name}_mean": sum(lengths) / len(lengths),
        f"stream/length/{name}_p50": sorted_quantile(ordered, 0.5),
        f"stream/length/{name}_p90": sorted_quantile(ordered, 0.9),
    }


def length_metrics(
    trained: Sequence[Any], finished: Sequence[Any], unfinished: Sequence[Any]
) -> dict[str, float]:
    """Groups (:class:`~rlcore.stream.groups.Group`) trained this step, finished in its rounds, and still
    in flight at its cut."""
    metrics = _summary("trained", [len(r.tokens) for g in trained for r in g.responses])
    metrics.update(_summary("finished", [len(r.tokens) for g in finished for r in g.responses]))
    going = [len(r.tokens) for g in unfinished for r in g.responses if not r.done]
    if going:
        metrics["stream/length/unfinished_mean"] = sum(going) / len(going)
    return metrics


def version_lag_metrics(trained: Sequence[Any], version: int) -> dict[str, float]:
    """``stream/tokens_lag/<k>``: share of the trained groups' response tokens sampled under version
    ``version - k``."""
    counts: dict[int, int] = {}
    for g in trained:
        for r in g.responses:
            for v in r.versions:
                counts[version - v] = counts.get(version - v, 0) + 1
    total = sum(counts.values())
    return {f"stream/tokens_lag/{lag}": c / total for lag, c in sorted(counts.items())} if total else {}

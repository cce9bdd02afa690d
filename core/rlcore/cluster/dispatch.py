"""What every worker group shares, below both kinds of group: results in flight (:class:`Pending`,
:func:`wait_all`), each rank's data-parallel coordinate (:class:`Topology`) and how a batch is cut into
per-rank pieces (:func:`shards`).

:mod:`rlcore.cluster.group` (in-process) and :mod:`rlcore.cluster.ray_group` (Ray actors) both build on
these; neither imports the other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rlcore.api import Batch


class Pending:
    """Results of a call started on several ranks; :meth:`wait` returns them in rank order."""

    def __init__(self, collect: Callable[[], list[Any]]):
        self._collect = collect
        self._result: list[Any] | None = None

    def wait(self) -> list[Any]:
        if self._result is None:
            self._result = self._collect()
        return self._result

    @classmethod
    def wait_together(cls, pendings: Sequence[Pending]) -> None:
        """Wait for ``pendings`` (all of this class) as one, raising the first failure among any of them.
        A kind whose calls fail independently (Ray's) polls them together; this one has nothing to do
        before each :meth:`wait`."""


def wait_all(pendings: Sequence[Pending]) -> list[list[Any]]:
    """Wait for several calls at once, so that the first failure in *any* of them is raised at once
    (a sender blocked in a collective with a dead receiver would otherwise hide the receiver's death)."""
    by_kind: dict[type[Pending], list[Pending]] = {}
    for p in pendings:
        by_kind.setdefault(type(p), []).append(p)
    for kind, same in by_kind.items():
        kind.wait_together(same)
    return [p.wait() for p in pendings]


class Topology:
    """Each rank's DP coordinate, and which rank's result stands for each DP rank."""

    def __init__(self, role: str, reports: Sequence[tuple[int, int, bool]]):
        sizes = {int(size) for _, size, _ in reports}
        if len(sizes) != 1:
            raise ValueError(f"{role}: ranks disagree on the data-parallel size: {[r[1] for r in reports]}")
        self.dp_size = sizes.pop()
        self.dp_ranks = [int(dp) for dp, _, _ in reports]
        if self.dp_size < 1 or any(not 0 <= d < self.dp_size for d in self.dp_ranks):
            raise ValueError(f"{role}: data-parallel ranks {self.dp_ranks} do not fit dp_size {self.dp_size}")
        self.output_ranks: list[int] = []
        for dp in range(self.dp_size):
            holders = [r for r, (d, _, holds) in enumerate(reports) if d == dp and holds]
            if not holders:
                raise ValueError(
                    f"{role}: no rank holds the output of data-parallel rank {dp} (topology {list(reports)}); "
                    f"the engine's holds_output() must be true on one rank per data-parallel rank"
                )
            self.output_ranks.append(holders[0])


def shards(data: Batch | Sequence[Any], n: int, *, views: bool = False) -> list[Any]:
    """``n`` consecutive pieces of a batch or a list, sizes differing by at most one (some may be
    empty when there are fewer rows than pieces), as :meth:`Batch.chunk` cuts them.

    ``views``: a batch's pieces share memory with it (row slices of contiguous tensors stay
    contiguous), for pieces that are serialised right away; otherwise they are copies.
    """
    if isinstance(data, Batch) and not views:
        return data.chunk(n)
    base, extra = divmod(len(data), n)
    bounds, start = [], 0
    for i in range(n):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    if isinstance(data, Batch):
        return [
            Batch(
                {k: v[a:b] for k, v in data.tensors.items()},
                {k: v[a:b] for k, v in data.objects.items()},
                data.meta,
            )
            for a, b in bounds
        ]
    items = list(data)
    return [items[a:b] for a, b in bounds]

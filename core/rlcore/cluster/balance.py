"""Token-balanced data-parallel shards: which rows each rank gets so that all ranks do about the same work.

Every data-parallel rank waits for the slowest one at each gradient all-reduce, and a rank's time grows
with its tokens, not its rows. With RL's response lengths (a few to thousands of tokens), consecutive
equal-row shards can differ several-fold in tokens. :func:`balanced_order` reorders a batch's rows so
that :meth:`~rlcore.api.Batch.chunk` cuts shards of the same row counts as before (sizes differing by at
most one) whose token sums are close (verl's ``trainer.balance_batch``).

The method is the Karmarkar-Karp largest differencing method in its balanced form (equal part sizes):

1. sort the rows by weight and cut the sorted list into groups of ``k`` neighbours; each group is a
   partial solution of ``k`` parts holding one row each (``(-n) % k`` zero-weight placeholders fill
   the lightest group, so each part gets at most one and real sizes differ by at most one);
2. repeatedly take the two partial solutions with the largest spread (heaviest minus lightest part)
   and merge them, joining the heaviest part of one with the lightest of the other, the second
   heaviest with the second lightest, and so on;
3. the last one left is the partition; each part holds one item of every group, hence equal sizes.

Why this and not greedy LPT (heaviest row to the lightest part with room): differencing keeps each
merge's spread within the larger spread of its inputs, so the result is within a bound set by the
*neighbouring* weight gaps, and it is the method verl uses; LPT with a size cap has to force the last
rows into whatever parts still have room. The bound: merging parts sorted against each other never
widens the spread beyond the wider input, so the final spread is at most ``D``, the largest spread of
a starting group (at most ``max(weights) - min(weights)``, counting a 0 when placeholders were added),
and the heaviest part is at most ``sum(weights) / k + (k - 1) / k * D``. No partition has a heaviest
part below ``sum(weights) / k``, so ``(k - 1) / k * D`` also bounds the excess over the optimum.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence


def balanced_partitions(weights: Sequence[float], k: int) -> list[list[int]]:
    """Row indices ``0 .. len(weights) - 1`` in ``k`` parts whose heaviest weight sum is close to the
    smallest possible (within the bound in the module docstring).

    Part ``i`` has ``n // k + (1 if i < n % k else 0)`` rows, the sizes :meth:`Batch.chunk` cuts, and
    lists its rows in ascending order. Deterministic for the same ``weights``.

    >>> balanced_partitions([9, 1, 8, 2, 5], 2)  # sums 12 and 13
    [[0, 1, 3], [2, 4]]
    """
    if k < 1:
        raise ValueError(f"number of parts must be >= 1, got {k}")
    n = len(weights)
    # None is a zero-weight placeholder; placed before the lightest rows, all land in the first group.
    items: list[int | None] = [None] * ((-n) % k) + sorted(range(n), key=lambda i: (weights[i], i))
    # A partial solution: its k parts as (weight sum, rows), heaviest first.
    heap: list[tuple[float, int, list[tuple[float, list[int]]]]] = []
    tiebreak = itertools.count()  # equal spreads pop in push order, never comparing the part lists
    for start in range(0, len(items), k):
        parts = [
            (0.0 if i is None else float(weights[i]), [] if i is None else [i])
            for i in items[start : start + k]
        ]
        parts.sort(key=lambda p: -p[0])
        heapq.heappush(heap, (-(parts[0][0] - parts[-1][0]), next(tiebreak), parts))  # max-heap on spread
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = [(wa + wb, ra + rb) for (wa, ra), (wb, rb) in zip(a, reversed(b), strict=True)]
        merged.sort(key=lambda p: -p[0])
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), next(tiebreak), merged))
    parts = [sorted(rows) for _, rows in heap[0][2]] if heap else [[] for _ in range(k)]
    # Larger parts first, as chunk() cuts them (stable: heavier first among equal sizes).
    parts.sort(key=len, reverse=True)
    return parts


def balanced_order(weights: Sequence[float], k: int) -> list[int]:
    """A row permutation after which ``batch.index(order).chunk(k)`` gives the parts of
    :func:`balanced_partitions` (``order[j]`` is the original row placed at position ``j``), or the
    identity when the consecutive parts ``chunk(k)`` cuts are already no heavier.

    >>> balanced_order([400, 300, 200, 100], 2)  # shards of 500 and 500 tokens, not 700 and 300
    [1, 2, 0, 3]
    >>> balanced_order([100, 200, 200, 100], 2)
    [0, 1, 2, 3]
    """
    parts = balanced_partitions(weights, k)
    consecutive, start = 0.0, 0
    for part in parts:
        consecutive = max(consecutive, sum(weights[start : start + len(part)]))
        start += len(part)
    if consecutive <= max(sum(weights[i] for i in part) for part in parts):
        return list(range(len(weights)))
    return [row for part in parts for row in part]


def inverse(order: Sequence[int]) -> list[int]:
    """The permutation undoing ``order``: ``rows.index(order).index(inverse(order))`` is ``rows``."""
    out = [0] * len(order)
    for position, row in enumerate(order):
        out[row] = position
    return out

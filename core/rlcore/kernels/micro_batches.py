"""Grouping a batch's rows into micro-batches under a token budget, with even loads.

Shared by the train engines (``rlcore_fsdp``, ``rlcore_megatron``): pure Python over per-row token costs.
"""

from __future__ import annotations

import heapq


def plan_micro_batches(
    costs: list[int], micro_batch_size: int, max_tokens: int | None, balance: bool = True
) -> list[list[int]]:
    """Group row numbers ``0..len(costs)-1`` into micro-batches.

    ``costs[i]`` is what row ``i`` adds to a micro-batch's token count. Without ``max_tokens``:
    consecutive groups of ``micro_batch_size`` rows. With it: as few micro-batches as first-fit
    decreasing needs, and, with ``balance``, the rows then spread over that many micro-batches longest
    first into the least-loaded one, so their token loads differ by at most the longest row.

    Why balance: first-fit fills micro-batches to the brim and leaves the rest to a last one, often of a
    few hundred tokens. That one costs a full micro-batch's fixed work (a kernel launch per operator per
    layer, the gradient accumulation) for little compute: 1.9% of a 1.5B step on an H100
    (``docs/benchmarks.md``). verl balances its dynamic micro-batches too.
    """
    if micro_batch_size < 1:
        raise ValueError(f"EngineSpec.micro_batch_size must be >= 1, got {micro_batch_size}")
    if max_tokens is None:
        n = len(costs)
        return [list(range(i, min(i + micro_batch_size, n))) for i in range(0, n, micro_batch_size)]
    too_long = [i for i, c in enumerate(costs) if c > max_tokens]
    if too_long:
        i = too_long[0]
        raise ValueError(
            f"row {i} needs {costs[i]} tokens, more than EngineSpec.max_tokens_per_micro_batch={max_tokens}; "
            "raise it to at least the longest prompt + response (a sequence cannot be split)"
        )
    longest_first = sorted(range(len(costs)), key=lambda i: (-costs[i], i))
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in longest_first:
        for b, load in enumerate(loads):
            if load + costs[i] <= max_tokens:
                bins[b].append(i)
                loads[b] += costs[i]
                break
        else:
            bins.append([i])
            loads.append(costs[i])
    if balance and len(bins) > 1:
        bins = _spread(costs, longest_first, len(bins), max_tokens) or bins
    return [sorted(b) for b in bins]


def _spread(costs: list[int], order: list[int], k: int, max_tokens: int) -> list[list[int]] | None:
    """Rows in ``order`` each into the least-loaded of ``k`` micro-batches (LPT); None if one would then
    exceed ``max_tokens`` (first-fit can pack tighter than this greedy, rarely)."""
    heap = [(0, b) for b in range(k)]
    bins: list[list[int]] = [[] for _ in range(k)]
    for i in order:
        load, b = heapq.heappop(heap)
        if load + costs[i] > max_tokens:
            return None
        bins[b].append(i)
        heapq.heappush(heap, (load + costs[i], b))
    return bins

"""Token-balanced data-parallel shards: the partition against an exhaustive search, and a train role
that hands each rank its balanced shard of every mini-batch and restores the row order of ``infer``.

The bound checked is the one :mod:`rlcore.cluster.balance` proves: the heaviest part is at most the
optimum plus ``(k - 1) / k * (max(w) - lo)``, ``lo`` the lightest weight (0 when ``k`` does not divide
the row count, as zero-weight placeholders then fill the parts).
"""

import random

import pytest
import torch
from rlcore.api import Batch
from rlcore.cluster import LocalGroup, TrainRole
from rlcore.cluster.balance import balanced_order, balanced_partitions, inverse
from rlcore.cluster.workers import Worker


def chunk_sizes(n: int, k: int) -> list[int]:
    base, extra = divmod(n, k)
    return [base + (1 if i < extra else 0) for i in range(k)]


def optimum(weights: list[int], k: int) -> int:
    """The smallest heaviest-part sum over all partitions into parts of ``chunk_sizes`` rows, by
    exhaustive search (each row to every part with room; empty parts of one size are interchangeable)."""
    sizes, sums, counts = chunk_sizes(len(weights), k), [0] * k, [0] * k
    best = [sum(weights)]

    def place(i: int) -> None:
        if max(sums) >= best[0]:
            return
        if i == len(weights):
            best[0] = max(sums)
            return
        for j in range(k):
            if counts[j] == sizes[j]:
                continue
            if counts[j] == 0 and any(counts[q] == 0 and sizes[q] == sizes[j] for q in range(j)):
                continue
            sums[j] += weights[i]
            counts[j] += 1
            place(i + 1)
            sums[j] -= weights[i]
            counts[j] -= 1

    place(0)
    return best[0]


def bound(weights: list[int], k: int) -> float:
    lo = 0 if len(weights) % k else min(weights)
    return (k - 1) / k * (max(weights) - lo)


def heaviest(weights, parts) -> int:
    return max(sum(weights[i] for i in part) for part in parts)


@pytest.mark.parametrize("span", [(1, 20), (128, 1024)])
def test_partitions_are_within_the_bound_of_the_optimum(span):
    rng = random.Random(span[0])
    worst = 0.0
    for _ in range(300):
        k, n = rng.randint(1, 4), rng.randint(1, 9)
        weights = [rng.randint(*span) for _ in range(n)]
        parts = balanced_partitions(weights, k)
        assert [len(p) for p in parts] == chunk_sizes(n, k)  # the sizes chunk() cuts, in its order
        assert sorted(i for p in parts for i in p) == list(range(n))
        assert all(p == sorted(p) for p in parts)
        best = optimum(weights, k)
        got = heaviest(weights, parts)
        assert best <= got <= best + bound(weights, k) + 1e-9, (weights, k, parts)
        worst = max(worst, got / best)
    assert worst > 1.0  # the search found cases where differencing is not optimal: the check has teeth


def test_rl_lengths_balance_far_better_than_consecutive_shards():
    rng = random.Random(0)
    weights = [rng.randint(128, 1024) for _ in range(512)]
    k = 8
    parts = balanced_partitions(weights, k)
    mean = sum(weights) / k
    consecutive, start = [], 0
    for size in chunk_sizes(len(weights), k):
        consecutive.append(range(start, start + size))
        start += size
    assert heaviest(weights, parts) <= mean + bound(weights, k)
    assert heaviest(weights, parts) - mean < 0.01 * (heaviest(weights, consecutive) - mean)


def test_edge_cases_and_the_order_helpers():
    assert balanced_partitions([], 3) == [[], [], []]
    assert balanced_partitions([5], 3) == [[0], [], []]
    assert balanced_partitions([3, 1, 2], 1) == [[0, 1, 2]]
    assert balanced_partitions([7, 7, 7, 7], 2) == balanced_partitions([7, 7, 7, 7], 2)  # deterministic
    order = balanced_order([400, 300, 200, 100], 2)
    assert order == [1, 2, 0, 3]
    assert [order[i] for i in inverse(order)] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="number of parts must be >= 1"):
        balanced_partitions([1], 0)


class ShardWorker(Worker):
    """Rank ``rank`` of ``world_size`` with ``tp`` tensor-parallel peers per data-parallel rank (only
    the first holds outputs). It records the rows and tokens of each shard it gets; ``infer`` returns
    each row's id and token count, computed from the row itself."""

    def __init__(self, rank: int, world_size: int, tp: int = 1):
        self._start("actor", rank)
        self.tp, self.world_size, self.seen = tp, world_size, []

    def topology(self):
        return self.rank // self.tp, self.world_size // self.tp, self.rank % self.tp == 0

    def train_step(self, batch, loss_fn):
        tokens = int(batch["attention_mask"].sum())
        self.seen.append((batch["row"].tolist(), tokens, dict(batch.meta)))
        return {"tokens": float(tokens)}

    def infer(self, batch, outputs):
        self.seen.append((batch["row"].tolist(), int(batch["attention_mask"].sum()), dict(batch.meta)))
        if self.rank % self.tp:
            return None
        return Batch({"row": batch["row"].clone(), "tokens": batch["attention_mask"].sum(-1)})


def lengths_batch(lengths: list[int]) -> Batch:
    """One row per length, right-padded ``attention_mask``; ``row`` numbers the rows."""
    width = max(lengths)
    mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    return Batch({"row": torch.arange(len(lengths)), "attention_mask": mask, "response_mask": mask})


@pytest.mark.parametrize("tp", [1, 2])
def test_train_gives_each_rank_a_balanced_shard_of_each_mini_batch(tp):
    workers = [ShardWorker(r, 4, tp) for r in range(4)]
    balanced = TrainRole("actor", LocalGroup("actor", workers))
    dp = balanced.dp_size  # 4 with tp=1, 2 with tp=2
    rng = random.Random(tp)
    lengths = [rng.randint(128, 1024) for _ in range(27)]
    batch = lengths_batch(lengths)

    balanced.train(batch, loss_fn=None, mini_batch_size=10, shuffle_seed=5)  # mini-batches of 10, 10, 7
    plain_group = LocalGroup("actor", [ShardWorker(r, 4, tp) for r in range(4)])
    plain = TrainRole("actor", plain_group, balance_batch=False)
    plain.train(batch, loss_fn=None, mini_batch_size=10, shuffle_seed=5)

    holders = [workers[r * tp].seen for r in range(dp)]
    unbalanced = [plain_group.workers[r * tp].seen for r in range(dp)]
    for step in range(3):
        shards = [rank[step] for rank in holders]
        rows = [r for shard in shards for r in shard[0]]
        # The same rows make the mini-batch, with the same global counts; only their ranks differ.
        assert sorted(rows) == sorted(r for rank in unbalanced for r in rank[step][0])
        assert all(s[2] == unbalanced[0][step][2] for s in shards)
        assert [len(s[0]) for s in shards] == chunk_sizes(len(rows), dp)
        weights = [lengths[r] for r in rows]
        assert max(s[1] for s in shards) <= sum(weights) / dp + bound(weights, dp)
        assert max(s[1] for s in shards) <= max(s[1] for s in (rank[step] for rank in unbalanced))
    # Tensor-parallel peers get their holder's shard.
    assert all(workers[r].seen == workers[r - r % tp].seen for r in range(4))


def test_infer_returns_rows_in_the_callers_order():
    role = TrainRole("actor", LocalGroup("actor", [ShardWorker(r, 3) for r in range(3)]))
    lengths = [900, 10, 800, 20, 700, 30, 600]
    batch = lengths_batch(lengths)
    assert role._shard_order(batch) is not None  # balancing does reorder this batch
    out = role.infer(batch, ("tokens",))
    assert out["row"].tolist() == list(range(len(lengths)))
    assert out["tokens"].tolist() == lengths
    shards = [w.seen[0] for w in role.group.workers]
    assert [len(rows) for rows, _, _ in shards] == [3, 2, 2]
    assert max(tokens for _, tokens, _ in shards) <= sum(lengths) / 3 + bound(lengths, 3)


def test_balancing_is_skipped_where_it_cannot_help():
    one_rank = TrainRole("actor", LocalGroup("actor", [ShardWorker(0, 1)]))
    assert one_rank._shard_order(lengths_batch([900, 10, 800])) is None
    two = TrainRole("actor", LocalGroup("actor", [ShardWorker(r, 2) for r in range(2)]))
    assert two._shard_order(lengths_batch([10, 20, 20, 10])) is None  # consecutive shards are as good
    assert two._shard_order(Batch({"row": torch.arange(4)})) is None  # no attention_mask: no token counts
    off = TrainRole("actor", two.group, balance_batch=False)
    assert off._shard_order(lengths_batch([900, 800, 10, 20])) is None

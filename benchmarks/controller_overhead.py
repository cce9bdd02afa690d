"""The single controller's share of a training step: Ray dispatch and collection around engines of
known cost.

A train role of ``--ranks`` data-parallel Ray workers runs the fake train engine, given a fixed cost per
call that models a real engine's throughput: ``infer`` (old log-probs) costs ``tokens / (ranks * 3 *
tps)`` seconds and ``train_step`` ``tokens / (ranks * tps)`` (a backward pass is about twice a forward),
with ``tps`` = ``--tokens-per-second`` per rank. The fake also really computes its tiny model over every
token. One step = ``infer`` of the whole batch, then one ``train`` optimizer step on it, as a PPO/GRPO
step's trainer part. Batches are built directly as tensors: ``B`` sequences of ``--seq-len`` tokens
(half prompt, half response), with the fields such a step carries (``input_ids``, ``attention_mask``,
``position_ids`` ``[B, T]``; ``prompts``, ``responses``, ``response_mask``, ``old_log_probs``,
``advantages`` ``[B, T/2]``): 40 KiB per sequence.

Engine time is measured inside each worker around the engine call (the slowest rank per phase), so it
includes the fake's real compute. Controller overhead = (step wall time - engine time) / step wall time:
splitting the batch, serialising shards into the object store, the actor calls, workers reading their
shards, returning and joining results.

    python benchmarks/controller_overhead.py [--sizes 64,256,1024,4096] [--tokens-per-second 100000]

Prints a table and markdown rows ``| name | value | unit | hardware | command |``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from _machine import cpu_name  # benchmarks/, the script's folder, leads sys.path
from rlcore.api import Batch, EngineSpec
from rlcore.cluster import RayGroup, TrainRole, start_ray, stop_ray
from rlcore.cluster.workers import TrainWorker
from rlcore.testing.contract import token_nll_loss
from rlcore.testing.fake_config import FakeTrainConfig

VOCAB = 32


class CostWorker(TrainWorker):
    """A train worker whose fake engine's fixed costs can be set between runs."""

    def set_costs(self, step_cost_s: float, infer_cost_s: float) -> None:
        self.engine.config.step_cost_s = step_cost_s
        self.engine.config.infer_cost_s = infer_cost_s


def make_batch(size: int, seq_len: int, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    half = seq_len // 2
    prompts = torch.randint(0, VOCAB, (size, half), generator=g)
    responses = torch.randint(0, VOCAB, (size, half), generator=g)
    attention_mask = torch.ones(size, seq_len, dtype=torch.long)
    return Batch(
        {
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": attention_mask,
            "position_ids": torch.arange(seq_len).expand(size, seq_len).contiguous(),
            "response_mask": torch.ones(size, half, dtype=torch.long),
            "old_log_probs": torch.randn(size, half, generator=g),
            "advantages": torch.randn(size, half, generator=g),
        }
    )


def step(role: TrainRole, batch: Batch) -> tuple[float, float, float, float]:
    """One step: ``(infer wall, infer engine, train wall, train engine)`` seconds."""
    start = time.perf_counter()
    role.infer(batch, ("log_probs",))
    middle = time.perf_counter()
    role.train(batch, token_nll_loss)
    end = time.perf_counter()
    timings = role.group.call_all("last_timings")
    return (
        middle - start,
        max(t["infer"] for t in timings),
        end - middle,
        max(t["train_step"] for t in timings),
    )


def hardware() -> str:
    cpu = cpu_name("cpu")
    return f"{cpu}, {os.cpu_count()} cores, Ray local, load {os.getloadavg()[0]:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", default="64,256,1024,4096", help="batch sizes (sequences), comma-separated"
    )
    parser.add_argument("--seq-len", type=int, default=1024, help="tokens per sequence")
    parser.add_argument("--ranks", type=int, default=2, help="data-parallel workers")
    parser.add_argument(
        "--tokens-per-second", type=float, default=100_000, help="modelled training throughput per rank"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per size (after one warm-up)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    start_ray()
    spec = EngineSpec(model_path="", micro_batch_size=256)
    config = FakeTrainConfig(vocab_size=VOCAB, hidden_size=4, prev_token=False)

    def kwargs(rank, dist):
        return {
            "role": "actor",
            "engine_name": "fake",
            "spec": spec,
            "engine_config": config,
            "dist": dist,
            "device": "cpu",
        }

    role = TrainRole("actor", RayGroup("actor", CostWorker, kwargs, args.ranks))
    rows, table = [], []
    try:
        for size in sizes:
            tokens = size * args.seq_len
            train_cost = tokens / (args.ranks * args.tokens_per_second)
            role.group.call_all("set_costs", train_cost, train_cost / 3)
            batch = make_batch(size, args.seq_len)
            step(role, batch)  # warm-up
            runs = [step(role, batch) for _ in range(args.repeats)]
            wall = [r[0] + r[2] for r in runs]
            engine = [r[1] + r[3] for r in runs]
            overhead = [(w - e) / w * 100 for w, e in zip(wall, engine, strict=True)]
            infer_ms = statistics.median((r[0] - r[1]) * 1000 for r in runs)
            train_ms = statistics.median((r[2] - r[3]) * 1000 for r in runs)
            pct = statistics.median(overhead)
            mib = sum(t.numel() * t.element_size() for t in batch.tensors.values()) / 2**20
            table.append(
                (size, mib, statistics.median(wall), statistics.median(engine), infer_ms, train_ms, pct)
            )
            rows.append(
                f"| controller-overhead-bs{size} | {pct:.2f} | % of step time | {hardware()} | "
                f"`python benchmarks/controller_overhead.py --tokens-per-second {args.tokens_per_second:g}` |"
            )
    finally:
        role.shutdown()
        stop_ray()

    print(
        f"\n{args.ranks} ranks, {args.seq_len}-token sequences, modelled engine {args.tokens_per_second:g} tok/s/rank "
        f"(train), 3x that for infer; median of {args.repeats} steps"
    )
    print(
        f"{'batch':>6} {'MiB':>7} {'step s':>8} {'engine s':>9} {'infer ovh ms':>13} {'train ovh ms':>13} {'overhead %':>11}"
    )
    for size, mib, wall, engine, infer_ms, train_ms, pct in table:
        print(
            f"{size:>6} {mib:>7.1f} {wall:>8.3f} {engine:>9.3f} {infer_ms:>13.1f} {train_ms:>13.1f} {pct:>11.2f}"
        )
    print("\n| name | value | unit | hardware | command |\n|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    sys.exit(main())

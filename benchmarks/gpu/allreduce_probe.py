"""How fast two GPUs of the lent host all-reduce, at the sizes a TP=2 step moves (issue 17).

    python3 benchmarks/gpu/allreduce_probe.py [--out FILE]

Megatron's tensor parallelism without Transformer Engine all-reduces each layer's activations twice in
the forward and twice in the backward, unoverlapped: a 16,384-token micro-batch of the 0.5B shape is
16384 x 896 bf16 = 29 MB a call. This times NCCL all-reduces of such sizes (one process a GPU, median of
20 after 5 warm-ups) and prints the bus bandwidth, so a TP=2 row can be read against the interconnect.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES_MB = (4, 29, 117, 1024)


def _worker(rank: int, world: int, port: int, out: str | None) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    rows = []
    for mb in SIZES_MB:
        x = torch.ones(mb * 2**20 // 2, dtype=torch.bfloat16, device="cuda")
        times = []
        for i in range(25):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dist.all_reduce(x)
            end.record()
            torch.cuda.synchronize()
            if i >= 5:
                times.append(start.elapsed_time(end))
        ms = statistics.median(times)
        # Bus bandwidth as nccl-tests defines it: algorithm bandwidth x 2 (n - 1) / n.
        busbw = mb * 2**20 / (ms / 1e3) / 1e9 * 2 * (world - 1) / world
        rows.append(
            {"mb": mb, "ms_median": ms, "ms_min": min(times), "ms_max": max(times), "busbw_gbs": busbw}
        )
    if rank == 0:
        for r in rows:
            print(
                f"all-reduce {r['mb']:>5} MB  {r['ms_median']:8.3f} ms ({r['ms_min']:.3f}-{r['ms_max']:.3f})"
                f"  bus {r['busbw_gbs']:7.1f} GB/s"
            )
        if out:
            with open(out, "w") as f:
                json.dump({"world": world, "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    world = torch.cuda.device_count()
    mp.start_processes(_worker, args=(world, 29511, args.out), nprocs=world, start_method="spawn")


if __name__ == "__main__":
    main()

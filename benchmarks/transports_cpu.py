"""Weight-transport throughput on CPU, next to a plain memcpy of the same bytes.

Each transport moves one weight stream (a few hundred MB of fp32 tensors, bucketed as a train engine
exports them, one tensor larger than a bucket) from a sender to one receiver in another process, which
copies every received tensor into its own preallocated parameters (what ``load_weights`` does). Timed
end to end: from the first ``send`` call to the receiver's last copy (wall clock, one host). The memcpy
baseline is that last step alone: ``dst.copy_(src)`` for every tensor, in one process. ``inprocess``
has no second process by definition: its sender and receiver share one.

    python benchmarks/transports_cpu.py [--mib 256] [--bucket-mib 64] [--repeats 3]

Prints a table and markdown rows ``| name | value | unit | hardware | command |``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.multiprocessing as mp
from _machine import cpu_name  # benchmarks/, the script's folder, leads sys.path
from rlcore.devices import get_platform
from rlcore.transports.broadcast import BroadcastTransport
from rlcore.transports.config import TransportConfig
from rlcore.transports.inprocess import InProcessTransport
from rlcore.transports.ray_object_store import RayObjectStoreTransport
from rlcore.weights import assemble, bucketize

TENSOR_MIB = 8
BIG_MIB = 64


def layout(total_mib: int) -> list[tuple[str, int]]:
    """``total_mib`` of fp32 as ``(name, numel)``: one 64 MiB tensor (split across buckets), then 8 MiB ones."""
    names = [("embed.weight", BIG_MIB * 2**18)]
    names += [(f"layers.{i}.weight", TENSOR_MIB * 2**18) for i in range((total_mib - BIG_MIB) // TENSOR_MIB)]
    return names


def make_weights(total_mib: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(name, torch.randn(numel, generator=g)) for name, numel in layout(total_mib)]


def destination(total_mib: int) -> dict[str, torch.Tensor]:
    """The receiver's parameters, preallocated and touched once."""
    return {name: torch.zeros(numel) for name, numel in layout(total_mib)}


def load(stream, dst) -> None:
    """Copy a received stream into preallocated parameters, as a rollout engine's load_weights does."""
    for name, tensor in assemble(stream):
        dst[name].copy_(tensor)


def time_memcpy(weights, dst) -> float:
    start = time.perf_counter()
    for name, tensor in weights:
        dst[name].copy_(tensor)
    return time.perf_counter() - start


def time_inprocess(weights, dst, bucket_bytes) -> float:
    transport = InProcessTransport(TransportConfig(name="inprocess", bucket_bytes=bucket_bytes))
    start = time.perf_counter()
    load(transport.receive(transport.send(bucketize(weights, bucket_bytes))), dst)
    return time.perf_counter() - start


# -- ray -----------------------------------------------------------------------------------------
def ray_receiver_class():
    import ray

    @ray.remote(num_cpus=0)
    class RayReceiver:
        def __init__(self, total_mib):
            torch.set_num_threads(1)
            self.dst = destination(total_mib)

        def load(self, handle):
            load(RayObjectStoreTransport().receive(handle), self.dst)
            return time.time()

        def load_pickled(self, refs):
            import ray

            load((ray.get(ref) for ref in refs), self.dst)
            return time.time()

    return RayReceiver


def time_ray(weights, bucket_bytes, receiver) -> float:
    import ray

    transport = RayObjectStoreTransport(TransportConfig(name="ray", bucket_bytes=bucket_bytes))
    start = time.time()
    handle = transport.send(bucketize(weights, bucket_bytes))
    end = ray.get(receiver.load.remote(handle))
    del handle
    return end - start


def time_ray_pickled(weights, bucket_bytes, receiver) -> float:
    """The alternative the ray transport avoids: buckets of torch tensors put as they are (pickled)."""
    import ray

    start = time.time()
    refs = [ray.put(bucket) for bucket in bucketize(weights, bucket_bytes)]
    end = ray.get(receiver.load_pickled.remote(refs))
    del refs
    return end - start


# -- broadcast -----------------------------------------------------------------------------------
def broadcast_receiver(rank, world, port, total_mib, repeats, done):
    torch.set_num_threads(1)
    transport = BroadcastTransport(TransportConfig(name="broadcast", timeout_s=300), get_platform("cpu"))
    transport.init_group(rank, world, "127.0.0.1", port)
    dst = destination(total_mib)
    for _ in range(repeats):
        load(transport.receive(None), dst)
        done.put(time.time())
    transport.close()


def time_broadcast(weights, bucket_bytes, total_mib, repeats, receivers=1) -> list[float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    done = ctx.Queue()
    world = 1 + receivers
    procs = [
        ctx.Process(target=broadcast_receiver, args=(r, world, port, total_mib, repeats, done))
        for r in range(1, world)
    ]
    for p in procs:
        p.start()
    sender = BroadcastTransport(
        TransportConfig(name="broadcast", bucket_bytes=bucket_bytes, timeout_s=300), get_platform("cpu")
    )
    sender.init_group(0, world, "127.0.0.1", port)
    times = []
    for _ in range(repeats):
        start = time.time()
        sender.send(bucketize(weights, bucket_bytes))
        times.append(max(done.get(timeout=300) for _ in range(receivers)) - start)
    sender.close()
    for p in procs:
        p.join(timeout=60)
    return times


def hardware() -> str:
    cpu = cpu_name("cpu")
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__.split('+')[0]}, 1 torch thread"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="size of the weight stream in MiB")
    parser.add_argument("--bucket-mib", type=int, default=64, help="bucket size in MiB")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    bucket_bytes = args.bucket_mib * 2**20
    weights = make_weights(args.mib)
    nbytes = sum(t.numel() * t.element_size() for _, t in weights)
    dst = destination(args.mib)
    results: dict[str, list[float]] = {}

    results["memcpy (Tensor.copy_)"] = [time_memcpy(weights, dst) for _ in range(args.repeats)]
    results["inprocess"] = [time_inprocess(weights, dst, bucket_bytes) for _ in range(args.repeats)]

    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        receiver = ray_receiver_class().remote(args.mib)
        time_ray(weights, bucket_bytes, receiver)  # warm-up: worker imports, store pages
        results["ray (driver -> actor)"] = [
            time_ray(weights, bucket_bytes, receiver) for _ in range(args.repeats)
        ]
        time_ray_pickled(weights, bucket_bytes, receiver)
        results["ray, tensors pickled (not used)"] = [
            time_ray_pickled(weights, bucket_bytes, receiver) for _ in range(args.repeats)
        ]
    finally:
        ray.shutdown()

    bcast = time_broadcast(weights, bucket_bytes, args.mib, args.repeats + 1)
    results["broadcast gloo (1 -> 1 process)"] = bcast[1:]  # the first sync pays for connection warm-up

    command = f"python benchmarks/transports_cpu.py --mib {args.mib} --bucket-mib {args.bucket_mib}"
    base = statistics.median(results["memcpy (Tensor.copy_)"])
    print(
        f"\nstream: {nbytes / 2**20:.0f} MiB in {len(weights)} tensors, buckets of {args.bucket_mib} MiB; "
        f"median of {args.repeats}; load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'transport':34s} {'seconds':>8s} {'GB/s':>8s} {'vs memcpy':>10s}")
    rows = []
    for name, times in results.items():
        seconds = statistics.median(times)
        rate = nbytes / seconds / 1e9
        print(f"{name:34s} {seconds:8.3f} {rate:8.2f} {seconds / base:9.1f}x")
        rows.append(
            f"| {name}: sync {nbytes / 2**20:.0f} MiB to a receiver's parameters | {rate:.2f} | GB/s "
            f"| {hardware()} | `{command}` |"
        )
    print("\n| name | value | unit | hardware | command |\n|---|---|---|---|---|")
    print("\n".join(rows))
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""The longest single sequence the FSDP engine trains with Ulysses sequence parallelism (SP=4) against
without it (SP=1) on the same GPUs, and tokens/s at 32k tokens (issue 36, row
``fsdp-ulysses-longest-sequence-1.5b-4gpu``; goal: SP=4 trains a sequence of at least 64k tokens).

Each SP size (``--sp``) runs in its own fresh processes, one per GPU (``--gpus``), spawned here (no
torchrun). With SP=s the GPUs form ``gpus/s`` data-parallel groups of ``s`` consecutive ranks
(``fsdp.sequence_parallel_size``), and every group trains one sequence of the length tried: all ranks of a
group get the same row, each holds a ``1/s`` slice of its tokens. SP=1 is thus "the longest sequence one
GPU can hold" (each GPU trains its own sequence; parameters, gradients and optimizer state stay sharded
over all GPUs either way). A sequence is a quarter prompt and the rest response, laid out as rlcore
batches are (``benchmarks/_workload.py``: ``rl_batch``); the loss is the response-token NLL.

Engine settings a user would choose for long sequences: fp32 parameters with bf16 mixed precision,
gradient checkpointing, var-len attention on packed rows (``use_remove_padding``), the chunked logits
head (``logits_chunk_size`` 4096), ``max_tokens_per_micro_batch`` at the longest length (one micro-batch
per sequence), and the CUDA allocator's ``expandable_segments`` (``--no-expandable-segments`` turns it
off).

Per SP size, in order:

1. one untimed warm-up step at the first length;
2. the lengths (``--lengths``, increasing; ``--throughput-length`` joins them) one train step each,
   recording ok / oom / skipped, the step seconds and the peak allocated memory (rank 0, and the largest
   over the ranks). At ``--throughput-length`` (32768) it takes ``--steps`` timed steps instead: their
   median, min and max, tokens/s (the trained tokens of all groups over the step time) and MFU
   (``_workload.step_flops`` over ``gpus * --peak-tflops``);
3. the search stops at the first length that runs out of memory (on any rank: the ranks agree through
   an all-reduce over a gloo group after each step), or before a length whose step, estimated from the
   last step scaled quadratically in the length, would end past the SP size's time budget
   (``--budget-s``, counted from the start of its processes; recorded as "not tried: time budget").

``--deadline-s`` bounds the whole script: later SP sizes get what is left, the lengths that would end
past it are not tried, and processes still running at it (a rank hung in a collective) are killed; the
JSON then holds what was recorded. ``--out`` gets the environment, the arguments, per SP size its
records and a summary: the longest length that trained per SP size, tokens/s at 32k per SP size, and
the goal check (the largest SP size's longest >= ``--goal-length``).

GPU run (4 x H200; about 4 minutes)::

    python benchmarks/ulysses_gpu.py --gpus 4 --sp 4 1 --model-dir /tmp/models --out ulysses-1.5b.json

CPU smoke test (a two-layer model, two gloo ranks, SP 1 and 2, lengths 256 and 512; well under a minute)::

    python benchmarks/ulysses_gpu.py --tiny --out /tmp/ulysses_tiny.json
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.multiprocessing as mp
from _workload import (
    SHAPES,
    free_port,
    host_threads,
    model_config,
    nll_loss,
    peak_memory_gib,
    reset_peak_memory,
    rl_batch,
    save_random_model,
    step_flops,
)
from rlcore.api import Batch, DistInfo, EngineSpec
from rlcore.devices import get_platform

#: Seconds left for the parent to write the JSON after the last processes are killed at the deadline.
RESERVE_S = 15


# -- one sequence per data-parallel group ------------------------------------------------------------
def sequence(length: int, vocab: int, dp_rank: int, dp: int, seed: int) -> Batch:
    """One row of ``length`` real tokens (a quarter prompt, the rest response), the same on every rank of
    data-parallel group ``dp_rank``; the loss divides by the response tokens of all ``dp`` groups."""
    batch, _ = rl_batch(length, length, length, vocab, seed=seed * 1009 + dp_rank)
    batch.meta["global_tokens"] *= dp
    batch.meta["global_sequences"] = dp
    return batch


def build_engine(path: str, platform, info: DistInfo, sp: int, max_tokens: int):
    from rlcore_fsdp.config import FSDPConfig
    from rlcore_fsdp.engine import FSDPEngine

    spec = EngineSpec(
        model_path=path,
        dtype="float32",
        lr=1e-6,
        max_tokens_per_micro_batch=max_tokens,  # per rank; a group of sp ranks packs sp times as many
        gradient_checkpointing=True,
    )
    config = FSDPConfig(
        mixed_precision="bfloat16",
        use_remove_padding=True,
        attn_implementation="varlen",
        logits_chunk_size=4096,
        sequence_parallel_size=sp,
        # The settings its rows were measured with (the engine's ``auto`` would decide these by memory).
        compile=False,
        recompute_logits=True,
        reshard_after_forward=True,
        reduce_grads_once_per_step=False,
    )
    return FSDPEngine(spec, config, platform, info)


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


class Ranks:
    """What every rank must agree on, over a gloo group with a timeout (a rank stuck in a device
    collective after a failure elsewhere then fails this rank's agreement instead of hanging it)."""

    def __init__(self, timeout_s: float):
        import torch.distributed as dist

        self.dist = dist
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))

    def max(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, group=self.group)
        return t.tolist()


def train_once(engine, batch: Batch, platform, ranks: Ranks, simulate_oom: bool) -> dict:
    """One train step of ``batch``; its status (ok / oom / error), seconds and peak memory, agreed by
    every rank (any rank's out-of-memory makes the step's status oom)."""
    reset_peak_memory()
    error, oom, seconds = None, False, float("nan")
    try:
        platform.synchronize()
        start = time.perf_counter()
        engine.train_step(batch, nll_loss)
        platform.synchronize()
        seconds = time.perf_counter() - start
        if simulate_oom:  # --simulate-oom-from: after the step, so no collective is left waiting
            raise torch.OutOfMemoryError("simulated out of memory (--simulate-oom-from)")
    except Exception as exc:  # noqa: BLE001 - recorded, and every rank stops the search on it
        oom = _is_oom(exc)
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if not oom:
            traceback.print_exc()
    if error is not None:  # free what the failed step held before anything else runs
        with contextlib.suppress(Exception):
            engine.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        platform.empty_cache()
    memory = peak_memory_gib(platform)
    any_oom, any_error, slowest, memory_max = ranks.max(
        [float(oom), float(error is not None), seconds if error is None else 0.0, memory]
    )
    status = "oom" if any_oom else "error" if any_error else "ok"
    if status != "ok" and error is None:
        error = "out of memory on another rank" if any_oom else "another rank failed"
    return {
        "status": status,
        "step_s": slowest if status == "ok" else None,
        "peak_memory_gib": memory,
        "peak_memory_gib_max_rank": memory_max,
        "error": error,
    }


# -- one process per GPU, one set of processes per SP size -----------------------------------------
def worker(rank: int, world: int, sp: int, port: int, args, path: str, out: str, deadline: float) -> None:
    import torch.distributed as dist
    from rlcore_fsdp.engine import init_process_group

    started = time.time()
    platform = get_platform(args.device)
    torch.set_num_threads(host_threads(world))
    info = DistInfo(rank=rank, world_size=world, local_rank=rank, master_port=port)
    platform.set_device(rank)
    init_process_group(platform, info)
    ranks = Ranks(args.collective_timeout_s)
    dp, dp_rank = world // sp, rank // sp
    config = model_config(args.model)
    lengths = sorted(set(args.lengths) | {args.throughput_length})
    budget_end = min(started + args.budget_s, deadline)
    record = {"sp": sp, "dp": dp, "gpus": world, "warmup": None, "lengths": [], "throughput": None}

    def write() -> None:
        if rank == 0:
            tmp = Path(out + ".tmp")
            tmp.write_text(json.dumps(record))
            os.replace(tmp, out)

    def measured(length: int, times: list[float]) -> dict:
        median = statistics.median(times)
        flops = step_flops(config, [length] * dp)
        mfu = flops / median / (world * args.peak_tflops * 1e12) if args.peak_tflops > 0 else None
        return {"tokens_per_s": length * dp / median, "mfu": mfu, "flops_per_step": flops}

    failed = False
    try:
        engine = build_engine(path, platform, info, sp, max(lengths))
        record["setup_s"] = time.time() - started
        write()
        warm = train_once(
            engine, sequence(lengths[0], config.vocab_size, dp_rank, dp, 0), platform, ranks, False
        )
        record["warmup"] = {"length": lengths[0], **warm}
        write()
        stop = None if warm["status"] == "ok" else f"not tried: the warm-up step failed ({warm['status']})"
        last = (lengths[0], warm["step_s"])  # the step the next one's time is estimated from
        for length in lengths:
            row = {"length": length, "throughput": length == args.throughput_length}
            if stop is None and length != args.throughput_length:  # the throughput steps always run
                estimate = last[1] * (length / last[0]) ** 2
                # Every rank decides alike: any rank seeing the budget exceeded skips for all.
                (over,) = ranks.max([float(time.time() + estimate > budget_end)])
                row["estimated_s"] = estimate
                if over:
                    stop = "not tried: time budget"
            if stop is not None:
                record["lengths"].append({**row, "status": "skipped", "note": stop})
                continue
            steps = args.steps if length == args.throughput_length else 1
            times, peaks, result = [], [], None
            for k in range(steps):
                batch = sequence(length, config.vocab_size, dp_rank, dp, seed=1 + k)
                simulate = args.simulate_oom_from is not None and length >= args.simulate_oom_from
                result = train_once(engine, batch, platform, ranks, simulate and rank == world - 1)
                del batch
                if result["status"] != "ok":
                    break
                times.append(result["step_s"])
                peaks.append((result["peak_memory_gib"], result["peak_memory_gib_max_rank"]))
            if result["status"] == "ok":
                row.update(result, **measured(length, times))
                row["peak_memory_gib"] = max(p[0] for p in peaks)  # over the steps at this length
                row["peak_memory_gib_max_rank"] = max(p[1] for p in peaks)
                if length == args.throughput_length:
                    row.update(step_s=statistics.median(times), step_s_all=times)
                    row.update(step_s_min=min(times), step_s_max=max(times))
                    record["throughput"] = row
                last = (length, row["step_s"])
            else:
                row.update(result)
                failed = True
                stop = f"not tried: {length} failed ({result['status']})"
                gc.collect()
                platform.empty_cache()
            record["lengths"].append(row)
            write()
            if rank == 0:
                took = f" {row['step_s']:.2f} s" if row.get("step_s") else ""
                print(f"[sp={sp}] {length} tokens: {row['status']}{took}", flush=True)
    except Exception as exc:  # noqa: BLE001 - what was recorded goes back; the parent notes the failure
        failed = True
        record["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        traceback.print_exc()
        write()
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(3)  # the parent's join then ends the other ranks
    record["worker_s"] = time.time() - started
    record["done"] = True
    write()
    sys.stdout.flush(), sys.stderr.flush()
    if failed:  # a failed step may leave the device group mid-step: skip its orderly teardown
        ranks.max([0.0])  # every rank has written what it had
        os._exit(0)
    dist.destroy_process_group()


def run_sp(args, sp: int, path: Path, deadline: float) -> dict:
    """Spawn the ``args.gpus`` ranks of one SP size and return rank 0's record; killed at ``deadline``."""
    with tempfile.TemporaryDirectory(prefix="ulysses-") as tmp:
        out = str(Path(tmp) / "record.json")
        spawned = time.time()
        context = mp.spawn(
            worker,
            args=(args.gpus, sp, free_port(), args, str(path), out, deadline - RESERVE_S),
            nprocs=args.gpus,
            join=False,
        )
        failure = None
        while True:
            try:
                if context.join(timeout=1):
                    break
            except Exception as exc:  # noqa: BLE001 - a rank died; join ended the others
                failure = f"a rank failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
                break
            if time.time() > deadline - RESERVE_S / 2:
                for process in context.processes:  # only the processes spawned here, one by one
                    if process.is_alive():
                        process.kill()
                for process in context.processes:
                    process.join(10)
                failure = "killed at the script's deadline (--deadline-s)"
                break
        record = json.loads(Path(out).read_text()) if Path(out).is_file() else {"sp": sp, "lengths": []}
    record["wall_s"] = time.time() - spawned
    if failure:
        record["failure"] = failure
    return record


# -- report ---------------------------------------------------------------------------------------
def summarize(args, runs: list[dict]) -> dict:
    longest = {}
    throughput = {}
    for run in runs:
        ok = [r["length"] for r in run.get("lengths", []) if r.get("status") == "ok"]
        longest[run["sp"]] = max(ok) if ok else None
        t = run.get("throughput")
        throughput[run["sp"]] = (
            {k: t[k] for k in ("tokens_per_s", "mfu", "step_s", "step_s_min", "step_s_max")} if t else None
        )
    goal_sp = max(args.sp)
    got = longest.get(goal_sp)
    return {
        "longest_ok_length": {str(k): v for k, v in longest.items()},
        "throughput_length": args.throughput_length,
        "throughput": {str(k): v for k, v in throughput.items()},
        "goal": {
            "sp": goal_sp,
            "min_length": args.goal_length,
            "longest_ok_length": got,
            "met": got is not None and got >= args.goal_length,
        },
    }


def print_table(runs: list[dict], summary: dict) -> None:
    print("| SP | DP | length | status | step s | tokens/s | MFU | peak GiB (rank 0 / max) | note |")
    print("|---|---|---|---|---|---|---|---|---|")
    for run in runs:
        for r in run.get("lengths", []):
            step = f"{r['step_s']:.2f}" if r.get("step_s") else "-"
            if r.get("step_s_all"):
                step += f" ({r['step_s_min']:.2f}-{r['step_s_max']:.2f}, {len(r['step_s_all'])} steps)"
            tps = f"{r['tokens_per_s']:,.0f}" if r.get("tokens_per_s") else "-"
            mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"
            mem = (
                f"{r['peak_memory_gib']:.1f} / {r['peak_memory_gib_max_rank']:.1f}"
                if r.get("peak_memory_gib") is not None
                else "-"
            )
            note = r.get("note") or r.get("error") or ""
            print(
                f"| {run['sp']} | {run.get('dp', '-')} | {r['length']} | {r['status']} | {step} | {tps} | {mfu} | {mem} | {note} |"
            )
        if run.get("failure") or run.get("error"):
            print(f"| {run['sp']} | | | | | | | | {run.get('failure') or ''} {run.get('error') or ''} |")
    longest = ", ".join(f"SP={k}: {v}" for k, v in summary["longest_ok_length"].items())
    print(f"summary: longest sequence trained: {longest}")
    for sp, t in summary["throughput"].items():
        if t:
            mfu = f", MFU {100 * t['mfu']:.1f}%" if t["mfu"] is not None else ""
            print(
                f"summary: SP={sp} at {summary['throughput_length']} tokens: {t['tokens_per_s']:,.0f} tokens/s{mfu}"
            )
    g = summary["goal"]
    print(
        f"summary: goal SP={g['sp']} >= {g['min_length']} tokens: {'met' if g['met'] else 'NOT met'} (longest {g['longest_ok_length']})"
    )


def environment(platform) -> dict:
    import transformers

    env = {"torch": torch.__version__, "transformers": transformers.__version__, "device": platform.name}
    if platform.device_type == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(device_name=props.name, device_memory_gib=props.total_memory / 2**30)
        env["device_count"] = torch.cuda.device_count()
    env["PYTORCH_CUDA_ALLOC_CONF"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    return env


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-1.5b", choices=sorted(SHAPES))
    p.add_argument("--gpus", type=int, default=4, help="ranks (one per GPU) of every SP size's run")
    p.add_argument("--sp", nargs="+", type=int, default=[1, 4], help="sequence-parallel sizes to compare")
    p.add_argument(
        "--lengths",
        nargs="+",
        type=int,
        default=[16384, 32768, 65536, 98304, 131072, 196608, 262144],
        help="single-sequence lengths, tried in increasing order",
    )
    p.add_argument("--throughput-length", type=int, default=32768, help="length of the timed steps")
    p.add_argument("--steps", type=int, default=3, help="timed steps at --throughput-length")
    p.add_argument("--budget-s", type=float, default=100.0, help="wall seconds per SP size")
    p.add_argument("--deadline-s", type=float, default=235.0, help="wall seconds for the whole script")
    p.add_argument("--collective-timeout-s", type=float, default=60.0, help="the ranks' agreement timeout")
    p.add_argument("--goal-length", type=int, default=65536, help="the largest SP size's goal")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="per-device peak; 0 disables MFU")
    p.add_argument("--no-expandable-segments", action="store_true", help="keep the default CUDA allocator")
    p.add_argument(
        "--simulate-oom-from",
        type=int,
        default=None,
        help="test hook: the last rank reports out-of-memory after its steps at lengths >= this",
    )
    p.add_argument("--device", default="auto", help="rlcore device platform name")
    p.add_argument("--model-dir", default=None, help="where the random model is saved (default: a temp dir)")
    p.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny model, 2 gloo ranks, SP 1 and 2")
    p.add_argument("--out", required=True, help="JSON file for the results")
    args = p.parse_args(argv)
    if args.tiny:
        args.model, args.device, args.peak_tflops, args.gpus = "tiny", "cpu", 0.0, 2
        if args.sp == [1, 4]:
            args.sp = [1, 2]
        if args.lengths == p.get_default("lengths"):
            args.lengths = [256, 512]
        args.throughput_length, args.goal_length, args.steps = 256, 512, 2
        args.budget_s, args.deadline_s = min(args.budget_s, 25.0), min(args.deadline_s, 120.0)
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    start = time.time()
    deadline = start + args.deadline_s
    if not args.no_expandable_segments and "PYTORCH_CUDA_ALLOC_CONF" not in os.environ:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"  # the spawned ranks inherit it
    platform = get_platform(args.device)
    if platform.device_type != "cpu" and args.gpus > platform.device_count():
        raise SystemExit(f"--gpus {args.gpus}: only {platform.device_count()} devices visible")
    config = model_config(args.model)
    runs = []
    with contextlib.ExitStack() as stack:
        folder = Path(args.model_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="ulysses-")))
        path = save_random_model(args.model, folder, platform.set_device(0))
        gc.collect()
        platform.empty_cache()
        for sp in args.sp:
            kv = config.num_key_value_heads
            if args.gpus % sp or config.num_attention_heads % sp or (kv % sp and sp % kv):
                runs.append(
                    {"sp": sp, "lengths": [], "failure": f"SP={sp} does not divide the GPUs or heads"}
                )
                continue
            if time.time() > deadline - 2 * RESERVE_S:
                runs.append({"sp": sp, "lengths": [], "failure": "not run: the script's deadline"})
                continue
            runs.append(run_sp(args, sp, path, deadline))
            print(f"SP={sp} took {runs[-1]['wall_s']:.0f} s", flush=True)
    summary = summarize(args, runs)
    print_table(runs, summary)
    result = {
        "benchmark": "fsdp-ulysses-longest-sequence",
        "environment": environment(platform),
        "args": vars(args),
        "results": runs,
        "summary": summary,
        "wall_s": time.time() - start,
    }
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

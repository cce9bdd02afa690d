"""Training throughput of rlcore's FSDP engine next to a naive Hugging Face loop: tokens/s and MFU.

Every system trains the same random model on the same RL-like steps (``benchmarks/_workload.py``: a
Qwen2.5-0.5B- or 1.5B-shaped model, sequences of 128-1024 real tokens, about ``--tokens-per-step`` real
tokens per GPU and step, micro-batches of at most ``--max-tokens-per-micro-batch`` tokens, the
response-token NLL over the global token count). Each GPU trains its share of every step's sequences,
split as rlcore's controller splits them (token-balanced, ``trainer.balance_batch``).

Systems (``--systems``):

- ``hf-naive``: ``AutoModelForCausalLM`` in bf16 (parameters and AdamW state), SDPA, full logits and
  HF's own loss; each micro-batch right-padded to its longest row; DDP when on more than one GPU.
- ``fsdp-mp``: ``FSDPEngine`` with fp32 parameters and bf16 mixed precision (the usual RL setting),
  padded micro-batches, SDPA.
- ``fsdp-mp-packed``: as ``fsdp-mp`` with ``use_remove_padding`` and Hugging Face's SDPA, which keeps the
  packed sequences apart with an ``[N, N]`` block-diagonal mask.
- ``fsdp-mp-varlen``: as ``fsdp-mp`` with ``use_remove_padding`` and ``attn_implementation=varlen``
  (PyTorch's flash var-len kernel: attention work ``sum L**2``): rlcore's recommended GPU setting.
- ``fsdp-mp-varlen-compile``: as ``fsdp-mp-varlen`` with ``fsdp.compile`` (each decoder layer compiled).
- ``fsdp-bf16-varlen``: as ``fsdp-mp-varlen`` but with bf16 parameters and optimizer state, as the
  naive loop keeps them.

FLOPs are the model FLOPs of the real tokens (formula in ``benchmarks/_workload.py``: ``6 N T`` plus
causal attention ``6 n_layers d_attn sum L**2``; padding, recomputation, norms and the optimizer are
not counted). ``MFU = FLOPs / step_seconds / (gpus * --peak-tflops)``; ``--peak-tflops`` defaults to the
H100 SXM dense bf16 figure, 989 TFLOP/s. Step time is the median over ``--steps`` timed steps after
``--warmup`` untimed ones; tokens/s is the step's real tokens (all GPUs) over that time. Memory is the
peak allocated on rank 0 during the system's steps (``torch.accelerator``), or the process RSS on a CPU.
``--profile DIR`` also writes, per system, the operators that took the most device time in one step.

GPU runs (each GPU count in fresh processes spawned here, no torchrun)::

    python benchmarks/fsdp_train.py --models qwen2.5-0.5b qwen2.5-1.5b --gpus 1 2 --out fsdp_train.json

CPU smoke test (a two-layer model, gloo, a few tiny steps)::

    python benchmarks/fsdp_train.py --tiny --out /tmp/fsdp_train_tiny.json
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
from pathlib import Path

import torch
import torch.multiprocessing as mp
from _profile import profile_call
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
    shard,
    step_flops,
)
from rlcore.api import Batch, DistInfo, EngineSpec, LoraSpec
from rlcore.devices import get_platform

SYSTEMS = (
    "hf-naive",
    "fsdp-mp",
    "fsdp-mp-packed",
    "fsdp-mp-varlen",
    "fsdp-mp-varlen-compile",
    "fsdp-bf16-varlen",
)
DEFAULT_SYSTEMS = ("hf-naive", "fsdp-mp-varlen")


# -- systems -----------------------------------------------------------------------------------------
class NaiveHF:
    """The plain loop: bf16 model, SDPA, AdamW, HF's loss on right-padded micro-batches (DDP if world > 1)."""

    def __init__(self, path: Path, device: torch.device, world: int, max_tokens: int):
        from transformers import AutoModelForCausalLM

        self.device, self.max_tokens = device, max_tokens
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="sdpa")
        model.config.use_cache = False
        self.model = model.to(device).train()
        if world > 1:
            self.model = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[device.index] if device.index is not None else None
            )
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-6)

    def train_step(self, batch: Batch, global_tokens: int) -> None:
        from rlcore.kernels.micro_batches import plan_micro_batches
        from rlcore_fsdp.micro_batches import token_costs

        parts = plan_micro_batches(token_costs(batch, packed=True), 1, self.max_tokens)
        mask = batch["attention_mask"].bool()
        P = mask.shape[1] - batch["responses"].shape[1]
        for k, rows in enumerate(parts):
            seqs = [batch["input_ids"][i][mask[i]] for i in rows]
            n_prompt = [int(mask[i, :P].sum()) for i in rows]
            width = max(len(s) for s in seqs)
            ids = torch.zeros(len(rows), width, dtype=torch.long)
            att = torch.zeros_like(ids)
            labels = torch.full_like(ids, -100)
            for j, (s, p) in enumerate(zip(seqs, n_prompt, strict=True)):
                ids[j, : len(s)], att[j, : len(s)] = s, 1
                labels[j, p : len(s)] = s[p:]
            sync = k == len(parts) - 1 or not hasattr(self.model, "no_sync")
            context = self.model.no_sync() if not sync else _null()
            with context:
                out = self.model(
                    input_ids=ids.to(self.device),
                    attention_mask=att.to(self.device),
                    labels=labels.to(self.device),
                )
                n_labels = int((labels[:, 1:] != -100).sum())
                (out.loss * n_labels / global_tokens).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def build_system(name: str, path: Path, platform, info: DistInfo, args):
    if name == "hf-naive":
        device = platform.set_device(info.local_rank)
        return NaiveHF(path, device, info.world_size, args.max_tokens_per_micro_batch)
    from rlcore.kernels.micro_batches import plan_micro_batches
    from rlcore_fsdp.config import FSDPConfig
    from rlcore_fsdp.engine import FSDPEngine

    bf16 = name.startswith("fsdp-bf16")
    varlen = "-varlen" in name
    spec = EngineSpec(
        model_path=str(path),
        dtype="bfloat16" if bf16 else "float32",
        # --lora-rank: a PEFT adapter on every linear layer (alpha = 2 * rank), the base frozen.
        lora=LoraSpec(rank=args.lora_rank, alpha=2.0 * args.lora_rank) if args.lora_rank else None,
        lr=1e-6,
        max_tokens_per_micro_batch=args.max_tokens_per_micro_batch,
        gradient_checkpointing=args.gradient_checkpointing,
    )
    config = FSDPConfig(
        mixed_precision=None if bf16 else "bfloat16",
        use_remove_padding=varlen or name.endswith("-packed"),
        attn_implementation="varlen" if varlen else "sdpa",
        logits_chunk_size=args.logits_chunk_size,
        compile=name.endswith("-compile"),
        reshard_after_forward=not args.no_reshard_after_forward,
        reduce_grads_once_per_step=args.reduce_grads_once_per_step,
        fused_optimizer=None if args.no_fused_optimizer else True,
        recompute_logits=not args.no_recompute_logits,
    )
    if args.first_fit_micro_batches:  # the engine's planning before it balanced micro-batch loads
        import functools

        import rlcore_fsdp.engine

        rlcore_fsdp.engine.plan_micro_batches = functools.partial(plan_micro_batches, balance=False)
    return FSDPEngine(spec, config, platform, info)


def run_system(system, batches: list[Batch], platform) -> list[float]:
    times = []
    for batch in batches:
        platform.synchronize()
        start = time.perf_counter()
        if isinstance(system, NaiveHF):
            system.train_step(batch, batch.meta["global_tokens"])
        else:
            system.train_step(batch, nll_loss)
        platform.synchronize()
        times.append(time.perf_counter() - start)
    return times


def profile_step(system, batch: Batch, platform, path: str, rank: int) -> None:
    """One more step under ``torch.profiler`` (:func:`_profile.profile_call`); rank 0 writes."""
    profile_call(lambda: run_system(system, [batch], platform), path, write=rank == 0)


# -- one process per GPU -----------------------------------------------------------------------------
def worker(rank: int, world: int, port: int, args, model_name: str, path: str, out: str) -> None:
    import torch.distributed as dist
    from rlcore_fsdp.engine import init_process_group

    platform = get_platform(args.device)
    # Each rank's share of the host's cores, as Ray gives its actors: with every process using every
    # core, small host-side ops (building the next micro-batch) stall on contended thread pools while
    # the device waits for them (measured: 2-GPU steps 1.6x longer than 1-GPU steps of the same work).
    torch.set_num_threads(host_threads(world))
    info = DistInfo(rank=rank, world_size=world, local_rank=rank, master_port=port)
    platform.set_device(rank)
    init_process_group(platform, info)  # the engines join it; the naive loop's DDP uses it
    config = model_config(model_name)
    steps = args.warmup + args.steps
    # Global batches (same for every system); each rank trains its data-parallel share.
    global_batches = [
        rl_batch(args.tokens_per_step * world, args.min_len, args.max_len, config.vocab_size, seed=s)
        for s in range(steps)
    ]
    flops = [step_flops(config, lengths) for _, lengths in global_batches]
    tokens = [sum(lengths) for _, lengths in global_batches]
    rows = []
    for name in args.systems:
        shards = [shard(b, world, rank) for b, _ in global_batches]
        reset_peak_memory()
        error = None
        try:
            system = build_system(name, Path(path), platform, info, args)
            times = run_system(system, shards, platform)
            if args.profile:  # every rank steps (the step is collective); rank 0 writes
                where = Path(args.profile) / f"{model_name}-{world}gpu-{name}.txt"
                profile_step(system, shards[-1], platform, str(where), rank)
        except torch.OutOfMemoryError as exc:  # report, and go on with the next system
            times, error = [], f"out of memory: {str(exc).splitlines()[0]}"
        except Exception as exc:  # a broken variant must not cost the other rows (device time is scarce)
            times, error = [], f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            traceback.print_exc()
        system = None
        memory = peak_memory_gib(platform)
        timed = times[args.warmup :]
        median = statistics.median(timed) if timed else float("nan")
        step_tokens = statistics.median(tokens[args.warmup :])
        step_flops_ = statistics.median(flops[args.warmup :])
        mfu = (
            step_flops_ / median / (world * args.peak_tflops * 1e12)
            if args.peak_tflops > 0 and timed
            else None
        )
        rows.append(
            {
                "system": name,
                "model": model_name,
                "gpus": world,
                "tokens_per_s": step_tokens / median if timed else None,
                "mfu": mfu,
                "step_s_median": median if timed else None,
                "step_s": timed,
                "tokens_per_step": step_tokens,
                "flops_per_step": step_flops_,
                "max_tokens_per_micro_batch": args.max_tokens_per_micro_batch,
                "gradient_checkpointing": args.gradient_checkpointing,
                "reshard_after_forward": not args.no_reshard_after_forward,
                "reduce_grads_once_per_step": args.reduce_grads_once_per_step,
                "recompute_logits": not args.no_recompute_logits,
                "balanced_micro_batches": not args.first_fit_micro_batches,
                "peak_memory_gib": memory,
                "lora_rank": args.lora_rank if name != "hf-naive" else 0,
                "error": error,
            }
        )
        gc.collect()
        platform.empty_cache()
    if rank == 0:
        Path(out).write_text(json.dumps(rows))
    dist.destroy_process_group()


def environment(platform) -> dict:
    import transformers

    env = {"torch": torch.__version__, "transformers": transformers.__version__, "device": platform.name}
    if platform.device_type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(0)
    return env


def print_table(rows: list[dict]) -> None:
    header = f"{'model':<14} {'gpus':>4} {'system':<16} {'tokens/s':>12} {'MFU':>7} {'step s':>8}  note"
    print(header)
    print("-" * len(header))
    for r in rows:
        tps = f"{r['tokens_per_s']:,.0f}" if r["tokens_per_s"] else "-"
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        step = f"{r['step_s_median']:.3f}" if r["step_s_median"] else "-"
        print(
            f"{r['model']:<14} {r['gpus']:>4} {r['system']:<16} {tps:>12} {mfu:>7} {step:>8}  {r['error'] or ''}"
        )


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-1.5b"], choices=sorted(SHAPES))
    p.add_argument("--gpus", nargs="+", type=int, default=[1])
    p.add_argument("--systems", nargs="+", default=list(DEFAULT_SYSTEMS), choices=SYSTEMS)
    p.add_argument(
        "--lora-rank", type=int, default=0, help="train a LoRA adapter of this rank (FSDP systems); 0: full"
    )
    p.add_argument("--tokens-per-step", type=int, default=65536, help="real tokens per GPU and step")
    p.add_argument("--max-tokens-per-micro-batch", type=int, default=16384)
    p.add_argument("--min-len", type=int, default=128)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--peak-tflops", type=float, default=989.0, help="per-device peak; 0 disables MFU")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument(
        "--reduce-grads-once-per-step",
        action="store_true",
        help="fsdp.reduce_grads_once_per_step: one gather and one reduce-scatter per layer and step",
    )
    p.add_argument("--no-fused-optimizer", action="store_true", help="fsdp.fused_optimizer=null")
    p.add_argument(
        "--no-recompute-logits",
        action="store_true",
        help="fsdp.recompute_logits=false: keep the head's logits for the backward",
    )
    p.add_argument(
        "--first-fit-micro-batches",
        action="store_true",
        help="plan micro-batches first-fit, without balancing their loads (the engine before it balanced)",
    )
    p.add_argument(
        "--no-reshard-after-forward",
        action="store_true",
        help="fsdp.reshard_after_forward=false: keep each layer's gathered weights until its backward",
    )
    p.add_argument(
        "--expandable-segments",
        action="store_true",
        help="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (less fragmentation near the memory limit)",
    )
    p.add_argument("--profile", default=None, help="folder for each system's top operators (one step)")
    p.add_argument("--logits-chunk-size", type=int, default=4096)
    p.add_argument("--device", default="auto", help="rlcore device platform name")
    p.add_argument(
        "--model-dir", default=None, help="where the random models are saved (default: a temp dir)"
    )
    p.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny model, few short steps")
    p.add_argument("--out", required=True, help="JSON file for the results")
    args = p.parse_args(argv)
    if args.tiny:
        args.models, args.device, args.peak_tflops = ["tiny"], "cpu", 0.0
        args.tokens_per_step, args.max_tokens_per_micro_batch = 512, 256
        args.min_len, args.max_len, args.steps, args.warmup = 16, 64, 2, 1
        args.gpus = [g for g in args.gpus if g <= 2] or [1]
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.expandable_segments:  # before the first device allocation; the spawned ranks inherit it
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    platform = get_platform(args.device)
    # A temp folder of random models (GBs at 7B) is removed after the run; --model-dir keeps them.
    with contextlib.ExitStack() as stack:
        folder = Path(
            args.model_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="fsdp-bench-"))
        )
        rows = _run_all(args, platform, folder)
    print_table(rows)
    result = {"environment": environment(platform), "args": vars(args), "results": rows}
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


def _run_all(args, platform, folder: Path) -> list[dict]:
    """Every model x GPU-count run; one row per system."""
    rows = []
    for model_name in args.models:
        path = save_random_model(model_name, folder, platform.set_device(0))
        platform.empty_cache()
        for world in args.gpus:
            if platform.device_type != "cpu" and world > platform.device_count():
                print(f"skipping {world} GPUs: only {platform.device_count()} visible", file=sys.stderr)
                continue
            with tempfile.NamedTemporaryFile(suffix=".json") as part:
                mp.spawn(
                    worker, args=(world, free_port(), args, model_name, str(path), part.name), nprocs=world
                )
                rows += json.loads(Path(part.name).read_text())
    return rows


if __name__ == "__main__":
    main()

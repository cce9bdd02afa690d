"""rlcore's Megatron engine on one or two GPUs: numerics against HF in bf16, and training tokens/s.

For each layout (``--layouts``: ``tp2`` tensor-parallel, ``pp2`` two pipeline stages, ``dp2`` data
parallel with the distributed optimizer; ``tp1`` with ``--gpus 1``: one GPU, for the row against the
FSDP engine's ``benchmarks/fsdp_train.py``; for mixture-of-experts shapes ``ep2``/``ep4`` expert
parallelism over 2/4 data-parallel ranks and ``dp4`` its EP=1 baseline) ``--gpus`` fresh processes (spawned here, no torchrun) build
``MegatronEngine`` in bf16 from a random model of the ``--model`` shape (Qwen2.5-0.5B by default; built
and saved here: no download), then

1. **numerics**: ``infer`` log-probs and entropy on a probe batch, compared with the HF model on the same
   bf16 weights run in fp32 (the reference). HF's own bf16 forward is measured against the same reference;
   the engine passes when its mean error is within twice HF-bf16's (floor 1e-3), i.e. the two bf16
   implementations are equally far from exact.
2. **throughput**: ``train_step`` on RL-like steps, the workload of ``benchmarks/_workload.py`` that
   ``benchmarks/fsdp_train.py`` also runs:
   sequences of 128-1024 real tokens, a quarter prompt (left-padded) and the rest response
   (right-padded), ``--tokens-per-step`` real tokens per GPU and step, micro-batches of at most
   ``--max-tokens-per-micro-batch`` tokens, response-token NLL over the global token count.
   ``tokens/s`` counts real tokens; MFU uses the FLOP formula of ``_workload.py``.

The engine's switches: ``--remove-padding`` (packed var-len attention), ``--logits-chunk-size N`` (the
chunked head), ``--no-recompute-logits`` (TP=1: the head keeps its logits for the backward, as the FSDP
rows' setting does), ``--compile``, ``--overlap-grad-reduce``, ``--gradient-checkpointing``. ``--profile DIR``
writes one more step's top operators and the device's idle gaps (``_profile.py``); peak memory is the
peak allocated on rank 0 during the timed steps.

GPU runs (megatron-core from the SGLang bundle; the ``megatron-*`` stages of ``python -m benchmarks.gpu`` run the rows of
``docs/benchmarks.md``, each beside the FSDP engine)::

    python benchmarks/megatron_gpu.py --gpus 1 --layouts tp1 --model qwen2.5-1.5b --remove-padding \
        --logits-chunk-size 4096 --tokens-per-step 262144 --out megatron_tp1.json
    python benchmarks/megatron_gpu.py --layouts tp2 dp2 pp2 --remove-padding --out megatron_2gpu.json

CPU smoke test (tiny model, gloo; imports the *test-only* CUDA redirection of
``plugins/megatron/tests/mcore_cpu_redirect.py``, never used otherwise)::

    python benchmarks/megatron_gpu.py --tiny --out /tmp/megatron_tiny.json
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _workload
import torch
import torch.multiprocessing as mp
from _profile import profile_call
from _workload import (
    SHAPES,
    free_port,
    nll_loss,
    peak_memory_gib,
    reset_peak_memory,
    rl_batch,
    shard,
    step_flops,
)
from rlcore.api import Batch, DistInfo, EngineSpec
from rlcore.devices import get_platform

REPO = Path(__file__).resolve().parents[1]
#: (tensor, pipeline, expert) parallel sizes; the rest of ``--gpus`` is data parallel (``tp1``/``dp2``/``dp4``:
#: none). ``ep2``/``ep4`` spread each MoE layer's experts over 2/4 data-parallel ranks (mixture-of-experts
#: shapes only); ``dp4`` is their EP=1 baseline, every rank holding every expert.
LAYOUTS = {
    "tp1": (1, 1, 1),
    "tp2": (2, 1, 1),
    "pp2": (1, 2, 1),
    "dp2": (1, 1, 1),
    "dp4": (1, 1, 1),
    "ep2": (1, 1, 2),
    "ep4": (1, 1, 4),
}


# -- model and data ----------------------------------------------------------------------------------
def save_random_model(folder: Path, device: torch.device, model: str, tiny: bool) -> Path:
    """The random-init causal LM of ``_workload.py`` shaped as ``model`` (or the tiny test model, a tiny
    mixture of experts when ``model`` is one)."""
    if tiny:
        from rlcore.testing.tiny import build_tiny_model

        if model in _workload.EXPERTS:  # 4 experts: EP=2 and EP=4 both divide them
            return build_tiny_model(folder / "tiny-moe", architecture="qwen3_moe", num_experts=4)
        return build_tiny_model(folder / "tiny")
    return _workload.save_random_model(model, folder, device)


# -- one process per GPU -----------------------------------------------------------------------------
def worker(rank: int, world: int, port: int, args, path: str, out: str) -> None:
    if args.tiny:
        sys.path.insert(0, str(REPO / "plugins" / "megatron" / "tests"))
        import mcore_cpu_redirect

        mcore_cpu_redirect.install()
        torch.set_num_threads(1)
    else:  # each rank its share of the host's cores, as fsdp_train.py (and Ray) give them
        torch.set_num_threads(_workload.host_threads(world))
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu
    from rlcore_megatron.config import MegatronConfig
    from rlcore_megatron.engine import MegatronEngine
    from transformers import AutoConfig

    platform = get_platform(args.device)
    config = AutoConfig.from_pretrained(path)
    probe, _ = rl_batch(args.probe_tokens, args.min_len, args.max_len, config.vocab_size, seed=1000)
    steps = [
        rl_batch(args.tokens_per_step * world, args.min_len, args.max_len, config.vocab_size, seed=s)
        for s in range(args.warmup + args.steps)
    ]
    rows, probes = [], {}
    for layout in args.layouts:
        tp, pp, ep = LAYOUTS[layout]
        spec = EngineSpec(
            model_path=path,
            dtype="bfloat16",
            lr=1e-6,
            micro_batch_size=10**6,  # the token budget decides the micro-batches
            max_tokens_per_micro_batch=args.max_tokens_per_micro_batch,
            gradient_checkpointing=args.gradient_checkpointing,
        )
        cfg = MegatronConfig(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            expert_model_parallel_size=ep,
            use_remove_padding=args.remove_padding,
            logits_chunk_size=args.logits_chunk_size,
            overlap_grad_reduce=args.overlap_grad_reduce,
            compile=args.compile,
            moe_grouped_gemm=not args.no_moe_grouped_gemm,
            split_gate_up=not args.fused_gate_up,
            recompute_logits=not args.no_recompute_logits,
        )
        info = DistInfo(rank=rank, world_size=world, local_rank=rank, master_port=port)
        started = time.perf_counter()
        engine = MegatronEngine(spec, cfg, platform, info)
        build_s = time.perf_counter() - started
        dp_rank, dp_size = engine.dp_rank_and_size()
        # Consecutive rows: the report compares the probe's log-probs with HF's row by row.
        result = engine.infer(probe.chunk(dp_size)[dp_rank], ("log_probs", "entropy"))
        if result is not None:  # TP rank 0 of the last stage, one per data-parallel rank
            probes[layout] = (dp_rank, {k: v.float() for k, v in result.tensors.items()})
        times = []
        reset_peak_memory()
        shards = [shard(batch, dp_size, dp_rank) for batch, _ in steps]  # split before the clock starts
        if args.manual_gc:  # is the host's end-of-step gap Python's collector? (megatron-LM's --manual-gc)
            gc.collect()
            gc.freeze()
            gc.disable()
        for part in shards:
            platform.synchronize()
            t0 = time.perf_counter()
            metrics = engine.train_step(part, nll_loss)
            platform.synchronize()
            times.append(time.perf_counter() - t0)
        if args.profile:  # one more step; every rank steps (collectives), rank 0 writes
            where = Path(args.profile) / f"megatron-{args.model}-{layout}.txt"
            step = functools.partial(engine.train_step, shards[-1], nll_loss)
            profile_call(step, str(where), write=rank == 0)
        if args.manual_gc:
            gc.enable()
            gc.unfreeze()
        timed = times[args.warmup :]
        median = statistics.median(timed)
        tokens = statistics.median(sum(lengths) for _, lengths in steps[args.warmup :])
        flops = statistics.median(step_flops(config, lengths) for _, lengths in steps[args.warmup :])
        rows.append(
            {
                "layout": layout,
                "tp": tp,
                "pp": pp,
                "ep": ep,
                "dp": dp_size,
                "gpus": world,
                "tokens_per_s": tokens / median,
                "mfu": flops / median / (world * args.peak_tflops * 1e12) if args.peak_tflops > 0 else None,
                "step_s_median": median,
                "step_s": timed,
                "tokens_per_step": tokens,
                "build_s": build_s,
                "last_loss": metrics["loss"],
                "peak_memory_gib": peak_memory_gib(platform),
                "memory_gib": platform.memory_stats(),
            }
        )
        del engine
        gc.collect()
        mpu.destroy_model_parallel()
        platform.empty_cache()
    torch.save({"rows": rows, "probes": probes, "probe": probe}, f"{out}.rank{rank}")
    dist.destroy_process_group()


# -- numerics ------------------------------------------------------------------------------------------
def hf_probe_outputs(path: str, probe: Batch, dtype: torch.dtype, device) -> dict[str, torch.Tensor]:
    """HF log-probs and entropy of the probe's response tokens (computed in ``dtype``, returned fp32)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    width = probe["responses"].shape[1]
    log_probs, entropy = [], []
    with torch.no_grad():
        for row in probe.split(4):
            row = Batch({k: v.to(device) for k, v in row.tensors.items()})
            logits = model(
                input_ids=row["input_ids"],
                attention_mask=row["attention_mask"],
                position_ids=row["position_ids"],
            ).logits[:, -width - 1 : -1]
            logp = torch.log_softmax(logits.float(), -1)
            log_probs.append(logp.gather(-1, row["responses"].unsqueeze(-1)).squeeze(-1).cpu())
            entropy.append(-(logp.exp() * logp).sum(-1).cpu())
    del model
    return {"log_probs": torch.cat(log_probs), "entropy": torch.cat(entropy)}


def errors(ours: dict, ref: dict, mask: torch.Tensor) -> dict[str, float]:
    out = {}
    for key in ("log_probs", "entropy"):
        diff = (ours[key] - ref[key])[mask].abs()
        out[f"{key}_max_abs_err"] = float(diff.max())
        out[f"{key}_mean_abs_err"] = float(diff.mean())
    return out


# -- driver -----------------------------------------------------------------------------------------
def environment(platform) -> dict:
    import megatron.core
    import transformers

    env = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "megatron_core": megatron.core.__version__,
        "device": platform.name,
    }
    if platform.device_type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(0)
    return env


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model", default="qwen2.5-0.5b", choices=sorted(SHAPES), help="shape of the random model"
    )
    p.add_argument("--layouts", nargs="+", default=["tp2", "pp2"], choices=sorted(LAYOUTS))
    p.add_argument("--gpus", type=int, default=2, help="processes (devices); 1 with --layouts tp1")
    p.add_argument("--tokens-per-step", type=int, default=65536, help="real tokens per GPU and step")
    p.add_argument("--max-tokens-per-micro-batch", type=int, default=16384)
    p.add_argument("--probe-tokens", type=int, default=8192, help="real tokens of the numerics probe")
    p.add_argument("--min-len", type=int, default=128)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--peak-tflops", type=float, default=989.0, help="per-device peak; 0 disables MFU")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--remove-padding", action="store_true", help="megatron.use_remove_padding (packed thd)")
    p.add_argument("--logits-chunk-size", type=int, default=None, help="megatron.logits_chunk_size")
    p.add_argument("--overlap-grad-reduce", action="store_true", help="megatron.overlap_grad_reduce")
    p.add_argument("--compile", action="store_true", help="megatron.compile (each decoder layer)")
    p.add_argument(
        "--no-moe-grouped-gemm",
        action="store_true",
        help="mixture-of-experts shapes: megatron-core's per-expert loop instead of grouped GEMMs",
    )
    p.add_argument(
        "--fused-gate-up",
        action="store_true",
        help="megatron-core's dense MLP (one GEMM into [gate | up]) instead of megatron.split_gate_up",
    )
    p.add_argument(
        "--no-recompute-logits",
        action="store_true",
        help="megatron.recompute_logits=false: the head keeps its logits (at TP > 1 each rank's slice), "
        "as the FSDP rows do",
    )
    p.add_argument("--profile", default=None, help="folder for each layout's top operators (one more step)")
    p.add_argument(
        "--manual-gc",
        action="store_true",
        help="Python's garbage collector off during the timed (and profiled) steps, the heap frozen first",
    )
    p.add_argument("--device", default="auto", help="rlcore device platform name")
    p.add_argument("--model-dir", default=None, help="where the random model is saved (default: a temp dir)")
    p.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny model, gloo, a few tiny steps")
    p.add_argument("--out", required=True, help="JSON file for the results")
    args = p.parse_args(argv)
    if args.tiny:
        args.device, args.peak_tflops = "cpu", 0.0
        args.tokens_per_step, args.max_tokens_per_micro_batch, args.probe_tokens = 256, 128, 128
        args.min_len, args.max_len, args.steps, args.warmup = 16, 48, 2, 1
    for layout in args.layouts:
        tp, pp, ep = LAYOUTS[layout]
        if args.gpus % (tp * pp * ep):
            p.error(f"layout {layout} (tp={tp}, pp={pp}, ep={ep}) does not fit --gpus {args.gpus}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    platform = get_platform(args.device)
    device = platform.set_device(0)
    folder = Path(args.model_dir or tempfile.mkdtemp(prefix="megatron-bench-"))
    path = str(save_random_model(folder, device, args.model, args.tiny))
    platform.empty_cache()
    world = args.gpus
    if platform.device_type != "cpu" and platform.device_count() < world:
        sys.exit(f"needs {world} devices, {platform.device_count()} visible")
    with tempfile.TemporaryDirectory() as tmp:
        part = os.path.join(tmp, "part")
        mp.spawn(worker, args=(world, free_port(), args, path, part), nprocs=world)
        parts = [torch.load(f"{part}.rank{r}", weights_only=False) for r in range(world)]
    probe = parts[0]["probe"]
    mask = probe["response_mask"].bool()
    reference = hf_probe_outputs(path, probe, torch.float32, device)
    hf_bf16 = errors(hf_probe_outputs(path, probe, torch.bfloat16, device), reference, mask)
    rows = parts[0]["rows"]
    for row in rows:
        shards = sorted(p["probes"][row["layout"]] for p in parts if row["layout"] in p["probes"])
        ours = {k: torch.cat([shard[k] for _, shard in shards]) for k in ("log_probs", "entropy")}
        row["numerics"] = errors(ours, reference, mask)
        row["numerics"]["within_bf16_tolerance"] = row["numerics"]["log_probs_mean_abs_err"] <= max(
            2 * hf_bf16["log_probs_mean_abs_err"], 1e-3
        ) and row["numerics"]["entropy_mean_abs_err"] <= max(2 * hf_bf16["entropy_mean_abs_err"], 1e-3)
    print(f"HF bf16 vs fp32 reference: {hf_bf16}")
    for row in rows:
        mfu = f"{100 * row['mfu']:.1f}%" if row["mfu"] is not None else "n/a"
        n = row["numerics"]
        print(
            f"{row['layout']:<4} tokens/s {row['tokens_per_s']:>12,.0f}  MFU {mfu:>6}  step {row['step_s_median']:.3f}s"
            f"  peak {row['peak_memory_gib']:.1f} GiB"
            f"  log-prob err mean {n['log_probs_mean_abs_err']:.2e} max {n['log_probs_max_abs_err']:.2e}"
            f"  within bf16 tolerance: {n['within_bf16_tolerance']}"
        )
    result = {
        "environment": environment(platform),
        "args": vars(args),
        "hf_bf16_numerics": hf_bf16,
        "results": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

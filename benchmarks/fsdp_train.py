"""Training throughput of rlcore's FSDP engine next to a naive Hugging Face loop: tokens/s and MFU.

Every system trains the same random model (a Qwen2.5-0.5B- or 1.5B-shaped ``Qwen2Config``, built here:
no download) on the same RL-like steps: sequences of 128-1024 real tokens (uniform), a quarter prompt
(left-padded) and the rest response (right-padded), about ``--tokens-per-step`` real tokens per GPU and
step, split into micro-batches of at most ``--max-tokens-per-micro-batch`` tokens. The loss is the
response-token NLL divided by the step's global response-token count (rlcore's normalisation).

Systems (``--systems``):

- ``hf-naive``: ``AutoModelForCausalLM`` in bf16 (parameters and AdamW state), SDPA, full logits and
  HF's own loss; each micro-batch right-padded to its longest row; DDP when on more than one GPU.
- ``fsdp-bf16``: ``FSDPEngine`` with bf16 parameters (as the naive loop), padded micro-batches.
- ``fsdp-mp``: ``FSDPEngine`` with fp32 parameters and bf16 mixed precision (the usual RL setting).
- ``fsdp-mp-packed``: as ``fsdp-mp`` with ``use_remove_padding`` (padding-free packed rows).

FLOPs are *model* FLOPs of the real (unpadded) tokens, the usual MFU convention, per step::

    FLOPs = 6 * N * T  +  6 * n_layers * d_attn * sum_s L_s**2

- ``N``: parameters of all matrix multiplications (attention q/k/v/o, MLP, and the output layer
  ``vocab x hidden`` once even when tied to the embedding, whose lookup costs nothing); ``6 * N`` per
  token is 2 (multiply-add) x 3 (forward + two backward matmuls).
- ``T = sum_s L_s``: real tokens of the step over all GPUs; ``L_s`` the length of sequence ``s``.
- Attention scores and the weighted sum of values each cost ``L**2 * d_attn / 2`` multiply-adds per
  layer under a causal mask (``d_attn = heads * head_dim``): ``2 * L**2 * d_attn`` FLOPs forward, times
  3 for training.
- Not counted: padding, activation recomputation (gradient checkpointing, the engine's chunked logits),
  norms, softmax, the optimizer.

``MFU = FLOPs / step_seconds / (gpus * --peak-tflops)``; ``--peak-tflops`` defaults to the H100 SXM
dense bf16 figure, 989 TFLOP/s. Step time is the median over ``--steps`` timed steps after
``--warmup`` untimed ones; tokens/s is the step's real tokens (all GPUs) over that time. Memory is the
platform's ``memory_stats()`` of rank 0 after the timed steps (allocated and reserved, not the peak).

GPU runs (each GPU count in fresh processes spawned here, no torchrun)::

    python benchmarks/fsdp_train.py --models qwen2.5-0.5b qwen2.5-1.5b --gpus 1 2 --out fsdp_train.json

CPU smoke test (a two-layer model, gloo, a few tiny steps)::

    python benchmarks/fsdp_train.py --tiny --out /tmp/fsdp_train_tiny.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp
from rlcore.api import Batch, DistInfo, EngineSpec
from rlcore.devices import get_platform

SHAPES = {
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
    ),
    "qwen2.5-1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
}
VOCAB = {"tiny": 512}
SYSTEMS = ("hf-naive", "fsdp-bf16", "fsdp-mp", "fsdp-mp-packed")


# -- model and data ----------------------------------------------------------------------------------
def qwen2_config(name: str):
    from transformers import Qwen2Config

    shape = SHAPES[name]
    return Qwen2Config(
        **shape,
        vocab_size=VOCAB.get(name, 151936),
        head_dim=shape["hidden_size"] // shape["num_attention_heads"],
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
    )


def save_random_model(name: str, folder: Path, device: torch.device) -> Path:
    """A random-init Qwen2 causal LM of shape ``name``, saved in bf16 (built on ``device``: fast)."""
    from transformers import Qwen2ForCausalLM

    path = folder / name
    if (path / "config.json").is_file():
        return path
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(qwen2_config(name)).to(torch.bfloat16)
    model.save_pretrained(str(path))
    del model
    return path


def matmul_params(config) -> int:
    """``N`` of the FLOP formula: matrix-multiply parameters, output layer counted once."""
    h, layers = config.hidden_size, config.num_hidden_layers
    q = config.num_attention_heads * config.head_dim
    kv = config.num_key_value_heads * config.head_dim
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * config.intermediate_size
    return layers * per_layer + config.vocab_size * h


def step_flops(config, lengths: list[int]) -> float:
    d_attn = config.num_attention_heads * config.head_dim
    dense = 6 * matmul_params(config) * sum(lengths)
    attention = 6 * config.num_hidden_layers * d_attn * sum(n * n for n in lengths)
    return float(dense + attention)


def rl_batch(tokens: int, min_len: int, max_len: int, vocab: int, seed: int) -> tuple[Batch, list[int]]:
    """Sequences of ``min_len..max_len`` real tokens until ``tokens`` are reached, laid out as rlcore
    batches are (left-padded prompts, right-padded responses)."""
    g = torch.Generator().manual_seed(seed)
    lengths: list[int] = []
    while sum(lengths) < tokens:
        lengths.append(int(torch.randint(min_len, max_len + 1, (1,), generator=g)))
    prompt_lens = [max(1, n // 4) for n in lengths]
    P, R = max(prompt_lens), max(n - p for n, p in zip(lengths, prompt_lens, strict=True))
    b = len(lengths)
    input_ids = torch.zeros(b, P + R, dtype=torch.long)
    mask = torch.zeros(b, P + R, dtype=torch.long)
    for i, (n, p) in enumerate(zip(lengths, prompt_lens, strict=True)):
        ids = torch.randint(3, vocab, (n,), generator=g)
        input_ids[i, P - p : P] = ids[:p]
        input_ids[i, P : P + n - p] = ids[p:]
        mask[i, P - p : P + n - p] = 1
    tensors = {
        "input_ids": input_ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
        "responses": input_ids[:, P:],
        "response_mask": mask[:, P:],
    }
    meta = {"global_tokens": int(mask[:, P:].sum()), "global_sequences": b}
    return Batch(tensors, meta=meta), lengths


def nll_loss(outputs, micro):
    mask = micro["response_mask"].to(outputs["log_probs"].dtype)
    loss = -(outputs["log_probs"] * mask).sum() / micro.meta["global_tokens"]
    return loss, {}


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
        from rlcore_fsdp.micro_batches import plan_micro_batches, token_costs

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
    from rlcore_fsdp.config import FSDPConfig
    from rlcore_fsdp.engine import FSDPEngine

    spec = EngineSpec(
        model_path=str(path),
        dtype="bfloat16" if name == "fsdp-bf16" else "float32",
        lr=1e-6,
        max_tokens_per_micro_batch=args.max_tokens_per_micro_batch,
        gradient_checkpointing=args.gradient_checkpointing,
    )
    config = FSDPConfig(
        mixed_precision=None if name == "fsdp-bf16" else "bfloat16",
        use_remove_padding=name.endswith("packed"),
        attn_implementation=args.attn_implementation,
        logits_chunk_size=args.logits_chunk_size,
    )
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


# -- one process per GPU -----------------------------------------------------------------------------
def worker(rank: int, world: int, port: int, args, model_name: str, path: str, out: str) -> None:
    import torch.distributed as dist
    from rlcore_fsdp.engine import init_process_group

    platform = get_platform(args.device)
    if platform.device_type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    info = DistInfo(rank=rank, world_size=world, local_rank=rank, master_port=port)
    platform.set_device(rank)
    init_process_group(platform, info)  # the engines join it; the naive loop's DDP uses it
    config = qwen2_config(model_name)
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
        system = build_system(name, Path(path), platform, info, args)
        shards = [b.chunk(world)[rank] for b, _ in global_batches]
        try:
            times = run_system(system, shards, platform)
            error = None
        except torch.OutOfMemoryError as exc:  # report, and go on with the next system
            times, error = [], f"out of memory: {exc}"
        memory = platform.memory_stats()
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
                "memory_gib": memory,
                "error": error,
            }
        )
        del system
        gc.collect()
        platform.empty_cache()
    if rank == 0:
        Path(out).write_text(json.dumps(rows))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    p.add_argument("--tokens-per-step", type=int, default=65536, help="real tokens per GPU and step")
    p.add_argument("--max-tokens-per-micro-batch", type=int, default=16384)
    p.add_argument("--min-len", type=int, default=128)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--peak-tflops", type=float, default=989.0, help="per-device peak; 0 disables MFU")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--attn-implementation", default="sdpa")
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
    platform = get_platform(args.device)
    folder = Path(args.model_dir or tempfile.mkdtemp(prefix="fsdp-bench-"))
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
    print_table(rows)
    result = {"environment": environment(platform), "args": vars(args), "results": rows}
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

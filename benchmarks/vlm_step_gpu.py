"""A GRPO step of a Qwen2.5-VL-3B-shaped model on one GPU (issue 54's ``vlm-grpo-step-3b-1gpu``).

The model has Qwen2.5-VL-3B-Instruct's shape (language model: 36 layers of 2048, 16 heads, 2 KV heads, MLP
11008, vocabulary 151936, tied embeddings; vision tower: 32 blocks of 1280, 16 heads, windows of 112
pixels, full attention in blocks 7/15/23/31) with random weights, saved in bf16, and the tiny VLM's
tokenizer and processor (:func:`rlcore.testing.tiny_vlm.build_tiny_vlm`). The workload is the visual
recipe's (``builtin:count_shapes``: 32 images of 56 x 56 pixels a step, 8 samples each) at ``rlcore
train``'s defaults otherwise, except responses of up to 256 tokens (the recipe's 4 would time nothing:
with random weights nearly every response runs to the limit), no SFT warm-up, no validation and no
checkpoint (``trainer.save_freq=-1``: the fp32 weights and optimizer state of 3.75B parameters are 60 GB).
The trainer is FSDP, the rollout vLLM or SGLang (``--rollout``), colocated on the one GPU.

Reported, as the median (and min / max) over the steps after the first (which compiles and warms up):
the step's seconds, each ``timing/*`` phase, rollout tokens per second (``perf/generate_tokens_per_s``),
and the post-sync check's gap (``sync/logprob_diff_mean`` against its ``sync/bound``) and the rollout's
own gap each step (``rollout/logprob_diff_mean``).

    python benchmarks/vlm_step_gpu.py --rollout vllm --name vllm --out /tmp/res/vlm_step [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = Path("/tmp/rlcore-bench-gpu/qwen2.5-vl-3b")
#: Qwen2.5-VL-3B-Instruct's config.json (text and vision), the numbers that set the compute.
TEXT_3B = dict(
    hidden_size=2048,
    intermediate_size=11008,
    num_hidden_layers=36,
    num_attention_heads=16,
    num_key_value_heads=2,
    head_dim=128,
    max_position_embeddings=4096,
)
VISION_3B = dict(
    depth=32,
    hidden_size=1280,
    intermediate_size=3420,
    num_heads=16,
    out_hidden_size=2048,
    window_size=112,
    fullatt_block_indexes=[7, 15, 23, 31],
)
VOCAB_3B = 151936
WORKLOAD = (
    "data.train_files=[builtin:count_shapes/train.jsonl]",
    "rollout.max_response_length=256",
    "trainer.warmup_sft_steps=0",
    "data.val_files=[]",
    "trainer.save_freq=-1",
)
PHASES_PREFIX = "timing/"
RLCORE = (sys.executable, "-c", "import sys; from rlcore.cli.main import main; sys.exit(main())")


def build_model(path: Path = MODEL) -> Path:
    import torch
    from rlcore.testing.tiny_vlm import build_tiny_vlm

    return build_tiny_vlm(
        path,
        architecture="qwen2_5_vl",
        num_layers=TEXT_3B["num_hidden_layers"],
        hidden_size=TEXT_3B["hidden_size"],
        num_heads=TEXT_3B["num_attention_heads"],
        num_kv_heads=TEXT_3B["num_key_value_heads"],
        intermediate_size=TEXT_3B["intermediate_size"],
        vision_depth=VISION_3B["depth"],
        vision_hidden_size=VISION_3B["hidden_size"],
        vocab_size=VOCAB_3B,
        text_config=TEXT_3B,
        vision_config=VISION_3B,
        dtype="bfloat16",
        device="cuda" if torch.cuda.is_available() else "cpu",
    )


def summarize(records: list[dict]) -> dict:
    """Median / min / max over the steps after the first of every timing phase, tok/s and gap."""
    steps = [r for r in records if r.get("step", 0) >= 2 and "timing/step" in r]
    keys = sorted(
        {k for r in steps for k in r if k.startswith(PHASES_PREFIX)}
        | {"perf/generate_tokens_per_s", "perf/tokens_per_s", "response_length/mean", "tokens/total"}
    )
    out: dict = {}
    for key in keys:
        values = [r[key] for r in steps if key in r]
        if values:
            out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    gaps = [
        {
            k: r[k]
            for k in ("step", "sync/logprob_diff_mean", "sync/floor", "sync/bound", "sync/probe_tokens")
            if k in r
        }
        for r in records
        if "sync/logprob_diff_mean" in r
    ]
    rollout_gap = [r["rollout/logprob_diff_mean"] for r in records if "rollout/logprob_diff_mean" in r]
    out["post_sync_checks"] = gaps
    out["rollout_logprob_diff_mean"] = rollout_gap
    out["steps_summarized"] = [r["step"] for r in steps]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollout", choices=("vllm", "sglang"), required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("overrides", nargs="*", help="more key=value for rlcore train")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    model = build_model()
    print(f"model {model} ready in {time.perf_counter() - start:.0f} s", flush=True)
    run_root = Path(tempfile.mkdtemp(prefix="vlm-step-"))
    overrides = [
        *WORKLOAD,
        f"model.path={model}",
        f"rollout.engine={args.rollout}",
        f"trainer.total_steps={args.steps}",
        *args.overrides,
    ]
    command = [
        *RLCORE,
        "train",
        *overrides,
        f"trainer.output_dir={run_root}",
        f"trainer.experiment_name={args.name}",
    ]
    print("$ rlcore train " + " ".join(shlex.quote(o) for o in overrides), flush=True)
    start = time.perf_counter()
    proc = subprocess.run(command, env=os.environ.copy())
    wall = time.perf_counter() - start
    run_dir = run_root / args.name
    args.out.mkdir(parents=True, exist_ok=True)
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        (args.out / f"{args.name}-metrics.jsonl").write_bytes(metrics.read_bytes())
    if proc.returncode != 0:
        print(f"rlcore train failed (exit {proc.returncode}); run directory {run_dir}", file=sys.stderr)
        return proc.returncode
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    result = {
        "row": f"vlm-grpo-step-3b-1gpu-{args.name}",
        "rollout": args.rollout,
        "command": "rlcore train " + " ".join(overrides),
        "model": {"text": TEXT_3B, "vision": VISION_3B, "vocab_size": VOCAB_3B, "weights": "random, bf16"},
        "wall_s": wall,
        **summarize(records),
    }
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    step = result.get("timing/step", {})
    tok = result.get("perf/generate_tokens_per_s", {})
    print(
        f"{result['row']}: step {step.get('median', float('nan')):.2f} s "
        f"({step.get('min', float('nan')):.2f}-{step.get('max', float('nan')):.2f}), rollout "
        f"{tok.get('median', float('nan')):.0f} tok/s; post-sync gaps "
        f"{[round(g.get('sync/logprob_diff_mean', float('nan')), 4) for g in result['post_sync_checks']]}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

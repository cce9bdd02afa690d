"""The post-sync check's statistics on SmolLM2-135M-Instruct (CPU): a healthy pair and the two wrong engines.

For each rollout dtype (float32, bfloat16), temperature (1.0, 0.7) and seed, the HF rollout samples the
check's probe (2 prompts x ``PROBE_SAMPLES`` x 16 tokens) and an fp32 transformers forward (the trainer)
scores the same tokens. The wrong engines' log-probs are formed from the trainer's own logits plus the
healthy pair's noise (so a bf16 wrong engine carries bf16 noise): *argmax* reports the most likely token's
log-prob, *no-temp* ``log_softmax(z)`` at a temperature other than 1. For each case it records what the
check and its diagnosis read (:mod:`rlcore.rollout.sync_check`): the trimmed mean |difference|, the share
of differing tokens where the rollout is above (argmax: one-sided), and the slope of the difference on the
trainer's log-prob (ignoring the temperature gives a slope near ``T - 1``).

    python benchmarks/sync_check_floor_smollm2.py --seeds 0 1 2 --out benchmarks/results/sync-check/smollm2_cpu.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from rlcore.api import RolloutSpec, SamplingParams
from rlcore.devices import get_platform
from rlcore.models import build_builtin
from rlcore.rollout.batching import completions_to_batch
from rlcore.rollout.hf import HFRollout
from rlcore.rollout.sync_check import PROBE_SAMPLES, gap_shape, trimmed_mean

QUESTIONS = ("What is 17 + 25?", "What is 304 + 18?")


def trainer_log_probs(model, batch, temperature: float) -> dict[str, torch.Tensor]:
    """float64 ``[B, R]`` log-probs of the sampled tokens at ``temperature`` (the trainer), of the most
    likely token (argmax), and of the sampled tokens at temperature 1 (no-temp)."""
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits
    P, R = batch["prompts"].shape[1], batch["responses"].shape[1]
    z = logits[:, P - 1 : P - 1 + R].double()
    tokens = batch["responses"][..., None]
    scaled = torch.log_softmax(z / temperature, -1)
    return {
        "sampled": scaled.gather(-1, tokens)[..., 0],
        "argmax": scaled.max(-1).values,
        "no-temp": torch.log_softmax(z, -1).gather(-1, tokens)[..., 0],
    }


def case(rollout: torch.Tensor, trainer: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    shape = gap_shape(rollout, trainer, mask)
    return {"trimmed": trimmed_mean((rollout - trainer).abs()[mask]), **shape}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cache", type=Path, default=Path("/tmp/rlcore-smollm2"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/sync-check/smollm2_cpu.json"))
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_builtin("smollm2-135m-instruct", args.cache)
    tok = AutoTokenizer.from_pretrained(path)
    prompts = [
        tok(
            tok.apply_chat_template(
                [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
            ),
            add_special_tokens=False,
        ).input_ids
        for q in QUESTIONS
    ]
    trainer = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rows = []
    for dtype in ("float32", "bfloat16"):
        engine = HFRollout(RolloutSpec(model_path=str(path), dtype=dtype), None, get_platform("cpu"))
        for temperature in (1.0, 0.7):
            for seed in args.seeds:
                start = time.perf_counter()
                params = SamplingParams(n=PROBE_SAMPLES, temperature=temperature, max_tokens=16, seed=seed)
                batch = completions_to_batch(engine.generate(prompts, params), engine.pad_id)
                mask = batch["response_mask"].bool()
                want = trainer_log_probs(trainer, batch, temperature)
                rollout = batch["rollout_log_probs"].double()
                noise = rollout - want["sampled"]
                cases = {"healthy": case(rollout, want["sampled"], mask)}
                cases["argmax"] = case(want["argmax"] + noise, want["sampled"], mask)
                if temperature != 1.0:
                    cases["no-temp"] = case(want["no-temp"] + noise, want["sampled"], mask)
                for name, stats in cases.items():
                    row = {"dtype": dtype, "temperature": temperature, "seed": seed, "engine": name}
                    row.update(stats, tokens=int(mask.sum()))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                print(
                    f"# {dtype} T={temperature} seed {seed}: {time.perf_counter() - start:.1f} s", flush=True
                )
        engine.shutdown()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": "smollm2-135m-instruct", "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Floor / wrong-engine gaps of HF rollout vs an fp32 trainer forward on SmolLM2 (CPU)."""

import sys
import time
from pathlib import Path

import torch
from rlcore.api import RolloutSpec, SamplingParams
from rlcore.devices import get_platform
from rlcore.models import build_builtin
from rlcore.rollout.batching import completions_to_batch
from rlcore.rollout.hf import HFRollout
from transformers import AutoModelForCausalLM, AutoTokenizer

torch.set_num_threads(8)
path = build_builtin(
    "smollm2-135m-instruct", Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/rlcore-smollm2")
)
tok = AutoTokenizer.from_pretrained(path)
qs = ["What is 17 + 25?", "What is 304 + 18?", "Name a colour.", "What is 9 + 91?"]
prompts = [
    tok(
        tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
    ).input_ids
    for q in qs
]
trainer = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def tlp(batch, T):
    with torch.no_grad():
        logits = trainer(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits
    P, R = batch["prompts"].shape[1], batch["responses"].shape[1]
    z = logits[:, P - 1 : P - 1 + R].double()
    lp = torch.log_softmax(z / T, -1)
    return (
        lp.gather(-1, batch["responses"][..., None]).squeeze(-1),
        lp.max(-1).values,
        torch.log_softmax(z, -1).gather(-1, batch["responses"][..., None]).squeeze(-1),
    )


def stats(d, m):
    a = d[m].abs()
    s = d[m]
    q = torch.quantile(a, torch.tensor([0.5, 0.9, 0.99], dtype=a.dtype))
    return f"n={int(m.sum())} mean={a.mean():.4f} trim99={a.sort().values[: int(len(a) * 0.99)].mean():.4f} p50={q[0]:.4f} p90={q[1]:.4f} max={a.max():.4f} signed={s.mean():+.4f} share_pos={(s > 0).double().mean():.2f}"


for dtype in ("float32", "bfloat16"):
    ro = HFRollout(RolloutSpec(model_path=str(path), dtype=dtype), None, get_platform("cpu"))
    for T in (1.0, 0.7):
        for seed in (0, 1, 2):
            t = time.time()
            params = SamplingParams(n=8, temperature=T, max_tokens=16, seed=seed)
            b = completions_to_batch(ro.generate(prompts[:2], params), ro.pad_id)
            m = b["response_mask"].bool()
            want, top, untemp = tlp(b, T)
            r = b["rollout_log_probs"].double()
            print(
                dtype,
                "T",
                T,
                "seed",
                seed,
                "healthy",
                stats(r - want, m),
                f"{time.time() - t:.1f}s",
                flush=True,
            )
            # argmax engine: rollout reports its (dtype) max log-prob: approx by trainer's max plus the healthy noise
            print(dtype, "T", T, "seed", seed, "argmax ", stats(top + (r - want) - want, m), flush=True)
            if T != 1.0:
                print(
                    dtype, "T", T, "seed", seed, "no-temp", stats(untemp + (r - want) - want, m), flush=True
                )

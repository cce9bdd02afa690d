"""Round 3 of issue 16: the GRPO step with the FSDP engine's defaults against its fast-path settings.

Reads, in ``benchmarks/results/grpo_step/``, ``round3_raw_generate.json`` (the bound's raw vLLM run) and
``round3_{baseline,tuned}_metrics.jsonl`` (``metrics.jsonl`` of each ``rlcore train`` run, all from one
warm machine: ``commands_round3.txt``), and writes ``round3_summary.json``: per-phase medians of the steps
after the first (``grpo_step_gpu.summarize``), the bound and step / bound for each run.

    python benchmarks/grpo_step_tuning.py [--dir benchmarks/results/grpo_step]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: What each run passed beyond grpo_step_gpu.py's own overrides.
OVERRIDES = {
    "baseline": [],
    "tuned": [
        "fsdp.compile=true",
        "fsdp.reshard_after_forward=false",
        "fsdp.reduce_grads_once_per_step=true",
        "fsdp.logits_chunk_size=4096",
        "fsdp.recompute_logits=false",
        "actor.max_tokens_per_micro_batch=16384",
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path(__file__).parent / "results" / "grpo_step")
    parser.add_argument("--mfu", type=float, default=0.288)
    args = parser.parse_args()
    from grpo_step_gpu import MFU, PROMPT_LEN, PROMPTS, N, bound, summarize

    raw = json.loads((args.dir / "round3_raw_generate.json").read_text())
    out: dict = {"raw_generate": raw, "runs": {}}
    for name, overrides in OVERRIDES.items():
        records = [json.loads(line) for line in (args.dir / f"round3_{name}_metrics.jsonl").open()]
        steps = [r for r in records if "timing/step" in r]
        run = summarize(steps)
        per_seq = PROMPT_LEN + run["response_length_mean"]
        limit = bound("0.5B", raw["seconds"], [round(per_seq)] * (PROMPTS * N), args.mfu or MFU["0.5B"])
        update = run["phases_s"].get("update_actor")
        out["runs"][name] = {
            "overrides": overrides,
            **run,
            "steps_run": [s["step"] for s in steps],
            "timed_steps": [s["step"] for s in steps[1:]],
            "update_tokens_per_s": run["tokens_per_step"] / update if update else None,
            "step1_s": steps[0]["timing/step"],
            "step1_phases_s": {k[7:]: v for k, v in steps[0].items() if k.startswith("timing/")},
            "bound": limit,
            "step_over_bound": run["step_s"] / limit["total_s"],
        }
    base, tuned = out["runs"]["baseline"], out["runs"]["tuned"]
    out["tuned_over_baseline_step"] = tuned["step_s"] / base["step_s"]
    (args.dir / "round3_summary.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

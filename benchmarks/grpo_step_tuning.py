"""Rounds 3 and 4 of issue 16: the GRPO step with the FSDP engine's defaults against its fast-path settings.

Reads, in ``benchmarks/results/grpo_step/``, ``round3_raw_generate.json`` (the bound's raw vLLM run; round 4
ran on the same hardware kind, NVIDIA H100 80GB HBM3, and reuses it) and ``roundN_<run>_metrics.jsonl``
(``metrics.jsonl`` of each ``rlcore train`` run, all of a round from one warm machine:
``commands_roundN.txt``), and writes ``roundN_summary.json``: per-phase medians of the steps after the first,
a profiled step left out (``grpo_step_gpu.summarize``), the bound and step / bound for each run. Round 4 adds
each run's peak GPU memory (``roundN_<run>_0.5B.json``, when ``grpo_step_gpu.py`` got to write it), the
update's and the reference's tokens per second, and the top operators (self CUDA time) of each worker's
profile table of the profiled step (``roundN_<run>_profile_step<K>_<role>-<rank>.txt``).

    python benchmarks/grpo_step_tuning.py [--round 4] [--dir benchmarks/results/grpo_step]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

FAST_PATH = [
    "fsdp.compile=true",
    "fsdp.reshard_after_forward=false",
    "fsdp.reduce_grads_once_per_step=true",
    "fsdp.logits_chunk_size=4096",
    "fsdp.recompute_logits=false",
    "actor.max_tokens_per_micro_batch=16384",
]
#: Per round, what each run passed beyond grpo_step_gpu.py's own overrides, and the step it profiled (0: none).
ROUNDS = {
    3: {"baseline": ([], 0), "tuned": (FAST_PATH, 0)},
    4: {
        "defaults": ([], 0),
        "tuned": ([*FAST_PATH, "rollout.gpu_memory_utilization=0.3"], 5),
        "tuned_repeat": ([*FAST_PATH, "rollout.gpu_memory_utilization=0.3"], 0),
    },
}


def top_operators(table: Path, count: int = 10) -> dict:
    """The first ``count`` rows of a ``key_averages().table()`` sorted by self CUDA time, and its totals.

    Names are cut at 55 characters by the table, so a Triton kernel and the op that launched it can show
    twice with the same time."""
    lines = table.read_text().splitlines()
    header = next(i for i, line in enumerate(lines) if line.strip().startswith("Name"))
    columns = re.split(r"\s{2,}", lines[header].strip())
    rows = []
    for line in lines[header + 2 :]:
        if line.startswith("-"):
            break
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) == len(columns):
            rows.append(dict(zip(columns, cells, strict=True)))
    totals = {m[0]: m[1] for m in re.findall(r"^(Self C\w+ time total): (.*)$", table.read_text(), re.M)}
    top = [
        {
            "name": r["Name"],
            "self_cuda": r["Self CUDA"],
            "self_cuda_pct": r["Self CUDA %"],
            "calls": int(r["# of Calls"]),
        }
        for r in rows[:count]
    ]
    return {"totals": totals, "top_self_cuda": top}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--round", type=int, default=3, choices=sorted(ROUNDS))
    parser.add_argument("--dir", type=Path, default=Path(__file__).parent / "results" / "grpo_step")
    parser.add_argument("--mfu", type=float, default=0.288)
    args = parser.parse_args()
    from grpo_step_gpu import MFU, PROMPT_LEN, PROMPTS, N, bound, summarize

    raw = json.loads((args.dir / "round3_raw_generate.json").read_text())
    prefix = f"round{args.round}"
    out: dict = {"raw_generate": raw, "runs": {}}
    if args.round != 3:
        out["raw_generate_from"] = "round3_raw_generate.json (same hardware kind; no step-raw run this round)"
    for name, (overrides, profiled) in ROUNDS[args.round].items():
        records = [json.loads(line) for line in (args.dir / f"{prefix}_{name}_metrics.jsonl").open()]
        steps = [r for r in records if "timing/step" in r]
        run = summarize(steps, profiled)
        per_seq = PROMPT_LEN + run["response_length_mean"]
        limit = bound("0.5B", raw["seconds"], [round(per_seq)] * (PROMPTS * N), args.mfu or MFU["0.5B"])
        update = run["phases_s"].get("update_actor")
        entry = {
            "overrides": overrides,
            **run,
            "steps_run": [s["step"] for s in steps],
            "timed_steps": [s["step"] for s in steps[1:] if s["step"] != profiled],
            "update_tokens_per_s": run["tokens_per_step"] / update if update else None,
            "step1_s": steps[0]["timing/step"],
            "step1_phases_s": {k[7:]: v for k, v in steps[0].items() if k.startswith("timing/")},
            "bound": limit,
            "step_over_bound": run["step_s"] / limit["total_s"],
        }
        if args.round >= 4:
            ref = run["phases_s"].get("ref_log_probs")
            timed = [s for s in steps[1:] if s["step"] != profiled]
            entry["ref_tokens_per_s"] = run["tokens_per_step"] / ref if ref else None
            entry["generate_tokens_per_s"] = statistics.median(
                s["perf/generate_tokens_per_s"] for s in timed if "perf/generate_tokens_per_s" in s
            )
            entry["steps_s"] = {s["step"]: s["timing/step"] for s in steps}
            result = args.dir / f"{prefix}_{name}_0.5B.json"
            rlcore = json.loads(result.read_text()).get("rlcore", {}) if result.exists() else {}
            entry["peak_gpu_memory_gib"] = rlcore.get("peak_gpu_memory_gib")
            entry["run_wall_s"] = rlcore.get("wall_s")
            if profiled:
                entry["profiled_step"] = {
                    "step": profiled,
                    "phases_s": {k[7:]: v for k, v in steps[profiled - 1].items() if k.startswith("timing/")},
                    "top_operators": {
                        t.stem.rsplit("_", 1)[1]: top_operators(t)
                        for t in sorted(args.dir.glob(f"{prefix}_{name}_profile_step{profiled}_*.txt"))
                    },
                }
        out["runs"][name] = entry
    runs = out["runs"]
    if args.round == 3:
        out["tuned_over_baseline_step"] = runs["tuned"]["step_s"] / runs["baseline"]["step_s"]
    else:
        out["tuned_over_defaults_step"] = runs["tuned"]["step_s"] / runs["defaults"]["step_s"]
        out["tuned_repeat_over_defaults_step"] = runs["tuned_repeat"]["step_s"] / runs["defaults"]["step_s"]
        out["notes"] = [
            "defaults: all 4 steps ran (metrics.jsonl complete), but grpo_step_gpu.py's 315 s timeout ended it"
            " during shutdown after the last checkpoint, so it wrote no round4_defaults_0.5B.json: no peak memory",
            "tuned: step 5 profiled (left out of the medians; its phases in profiled_step); step 1 includes"
            " torch.compile (cold cache); tuned_repeat ran on the same warm machine, no profile",
        ]
    (args.dir / f"{prefix}_summary.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

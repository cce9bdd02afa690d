"""The whole-step table and bar chart of ``docs/benchmarks.md`` from the GPU calls' raw files.

Reads, in ``benchmarks/results/grpo_step/``: ``round2_rlcore_metrics.jsonl`` (rlcore's ``metrics.jsonl``),
``round2_raw_generate.json`` (the bound's raw vLLM run, the same call) and ``round2_verl_step1.txt``
(verl's console line of its step 1), and writes ``summary.json`` and ``phases.png`` there.

    python benchmarks/grpo_step_report.py [--dir benchmarks/results/grpo_step] [--profiled-step 5]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PHASES = {  # rlcore phase -> verl timing key
    "generate": "gen",
    "old_log_probs": "old_log_prob",
    "ref_log_probs": "ref",
    "update_actor": "update_actor",
    "sync_weights": "update_weights",
}


def verl_step(path: Path) -> dict[str, float]:
    """``timing_s/*`` and the other numbers of verl's console line ``step:N - key:value - ...``."""
    out = {}
    for key, value in re.findall(r"([\w/]+):(-?[\d.e+-]+)(?= - |$)", path.read_text()):
        try:
            out[key] = float(value)
        except ValueError:
            pass
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path(__file__).parent / "results" / "grpo_step")
    parser.add_argument("--profiled-step", type=int, default=5)
    parser.add_argument("--mfu", type=float, default=0.288)
    args = parser.parse_args()
    from grpo_step_gpu import PROMPT_LEN, PROMPTS, N, bound, summarize

    records = [json.loads(line) for line in (args.dir / "round2_rlcore_metrics.jsonl").open()]
    steps = [r for r in records if "timing/step" in r]
    run = summarize(steps, args.profiled_step)
    rlcore = {p: run["phases_s"].get(p, 0.0) for p in PHASES}
    rlcore["other"] = run["step_s"] - sum(rlcore.values())  # controller, reward, advantages
    raw = json.loads((args.dir / "round2_raw_generate.json").read_text())
    per_seq = PROMPT_LEN + run["response_length_mean"]
    limit = bound("0.5B", raw["seconds"], [round(per_seq)] * (PROMPTS * N), args.mfu)
    verl = verl_step(args.dir / "round2_verl_step1.txt")
    first = steps[0]
    summary = {
        "rlcore_steps_timed": [s["step"] for s in steps[1:] if s["step"] != args.profiled_step],
        "rlcore_step_s": run["step_s"],
        "rlcore_step_range_s": run["step_range_s"],
        "rlcore_phases_s": rlcore,
        "rlcore_release_resume_s": run["release_resume_s"],
        "rlcore_sync_seconds": run["sync_s"],
        "rlcore_tokens_per_s_per_gpu": run["tokens_per_s_per_gpu"],
        "rlcore_step1_s": first["timing/step"],
        "rlcore_step1_phases_s": {p: first.get(f"timing/{p}", 0.0) for p in PHASES},
        "verl_step1_s": verl.get("timing_s/step"),
        "verl_step1_phases_s": {p: verl.get(f"timing_s/{k}", 0.0) for p, k in PHASES.items()},
        "verl_step1_tokens_per_s_per_gpu": verl.get("perf/throughput"),
        "verl_step1_max_memory_reserved_gib": verl.get("actor/perf/max_memory_reserved_gb"),
        "bound": limit,
        "rlcore_over_bound": run["step_s"] / limit["total_s"],
        "rlcore_step1_over_verl_step1": first["timing/step"] / verl["timing_s/step"] if verl else None,
    }
    (args.dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = {
        "rlcore, steps 2-4\n(median)": rlcore,
        "rlcore, step 1": {**summary["rlcore_step1_phases_s"], "other": 0.0},
        "verl, step 1": {**summary["verl_step1_phases_s"], "other": 0.0},
        "sum-of-parts\nbound": {
            "generate": limit["generate_s"],
            "ref_log_probs": limit["ref_s"],
            "update_actor": limit["update_s"],
            "sync_weights": limit["copy_floor_s"],
        },
    }
    for name, parts in bars.items():  # "other": what the phases do not cover
        if name.startswith(("rlcore, step 1", "verl")):
            total = summary["rlcore_step1_s"] if name.startswith("rlcore") else summary["verl_step1_s"]
            parts["other"] = max(0.0, total - sum(v for k, v in parts.items() if k != "other"))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    keys = [*PHASES, "other"]
    for i, parts in enumerate(bars.values()):
        left = 0.0
        for j, key in enumerate(keys):
            value = parts.get(key, 0.0)
            ax.barh(i, value, left=left, color=f"C{j}", label=key if i == 0 else None)
            left += value
        ax.text(left + 2, i, f"{left:.1f} s", va="center")
    ax.set_yticks(range(len(bars)), list(bars))
    ax.invert_yaxis()
    ax.set_xlabel(
        "seconds per GRPO step (64 prompts x 8 samples, 256 + 512 tokens, Qwen2.5-0.5B shape, 1 H100)"
    )
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(args.dir / "phases.png", dpi=120)


if __name__ == "__main__":
    main()

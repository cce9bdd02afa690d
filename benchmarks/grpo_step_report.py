"""The whole-step tables and bar charts of ``docs/benchmarks.md`` from the GPU calls' raw files.

``--round 5`` (the default): one chain on one warm H100 (``benchmarks/results/grpo_step/round5/``):
rlcore's FSDP fast path (``rlcore_fast_metrics.jsonl``, 5 steps, the last profiled), verl's two steps
(``verl_metrics.json``) and rlcore's defaults (``rlcore_defaults_metrics.jsonl``, right after on the same
machine); writes ``round5/summary.json`` and ``round5/phases.png``.

``--round 2``: ``round2_rlcore_metrics.jsonl`` (rlcore's ``metrics.jsonl``), ``round2_raw_generate.json``
(the bound's raw vLLM run, the same call) and ``round2_verl_step1.txt`` (verl's console line of its step
1); writes ``summary.json`` and ``phases.png``.

    python benchmarks/grpo_step_report.py [--round 5] [--dir benchmarks/results/grpo_step]
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
    parser.add_argument("--round", type=int, default=5, choices=(2, 5))
    args = parser.parse_args()
    if args.round == 5:
        round5(args.dir / "round5")
        return
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

    bars = {
        "rlcore, steps 2-4\n(median)": rlcore,
        "rlcore, step 1": with_other(summary["rlcore_step1_phases_s"], summary["rlcore_step1_s"]),
        "verl, step 1": with_other(summary["verl_step1_phases_s"], summary["verl_step1_s"]),
        "sum-of-parts\nbound": {
            "generate": limit["generate_s"],
            "ref_log_probs": limit["ref_s"],
            "update_actor": limit["update_s"],
            "sync_weights": limit["copy_floor_s"],
        },
    }
    draw(bars, args.dir / "phases.png")


def with_other(parts: dict[str, float], step_s: float) -> dict[str, float]:
    """``parts`` and ``other``: what the phases do not cover of the step (controller, reward, advantages),
    never below zero (phases can overlap by a few milliseconds)."""
    return {**parts, "other": max(0.0, step_s - sum(parts.values()))}


def rlcore_run(path: Path, profiled: int) -> tuple[dict, dict]:
    """(medians of the steps after the first, the profiled one left out; step 1) of a ``metrics.jsonl``."""
    from grpo_step_gpu import summarize

    steps = [r for r in map(json.loads, path.open()) if "timing/step" in r]
    return summarize(steps, profiled), steps[0]


def round5(folder: Path) -> None:
    """rlcore (fast path, defaults) and verl on one machine: the summary and the phase chart."""
    fast, fast_first = rlcore_run(folder / "rlcore_fast_metrics.jsonl", 5)
    defaults, _ = rlcore_run(folder / "rlcore_defaults_metrics.jsonl", 0)
    verl = {s["step"]: s for s in json.loads((folder / "verl_metrics.json").read_text())["steps"]}

    def phases(run: dict) -> dict[str, float]:
        return with_other({p: run["phases_s"].get(p, 0.0) for p in PHASES}, run["step_s"])

    def verl_phases(step: dict) -> dict[str, float]:
        return with_other(
            {p: step.get(f"timing_s/{k}", 0.0) for p, k in PHASES.items()}, step["timing_s/step"]
        )

    first = with_other({p: fast_first.get(f"timing/{p}", 0.0) for p in PHASES}, fast_first["timing/step"])
    bars = {
        "rlcore fast path,\nsteps 2-4 (median)": phases(fast),
        "rlcore defaults,\nsteps 2-4 (median)": phases(defaults),
        "verl, step 2": verl_phases(verl[2]),
        "rlcore fast path,\nstep 1": first,
        "verl, step 1": verl_phases(verl[1]),
    }
    summary = {
        "rlcore_fast_step_s": fast["step_s"],
        "rlcore_fast_step_range_s": fast["step_range_s"],
        "rlcore_defaults_step_s": defaults["step_s"],
        "rlcore_defaults_step_range_s": defaults["step_range_s"],
        "verl_step2_s": verl[2]["timing_s/step"],
        "verl_step1_s": verl[1]["timing_s/step"],
        "rlcore_fast_over_verl": fast["step_s"] / verl[2]["timing_s/step"],
        "rlcore_defaults_over_verl": defaults["step_s"] / verl[2]["timing_s/step"],
        "rlcore_step1_over_verl_step1": fast_first["timing/step"] / verl[1]["timing_s/step"],
        "phases_s": {name.replace("\n", " "): parts for name, parts in bars.items()},
        "rlcore_fast_tokens_per_s_per_gpu": fast["tokens_per_s_per_gpu"],
        "rlcore_defaults_tokens_per_s_per_gpu": defaults["tokens_per_s_per_gpu"],
        "verl_step2_tokens_per_s_per_gpu": verl[2].get("perf/throughput"),
        "verl_step2_mfu_actor": verl[2].get("perf/mfu/actor"),
        "rlcore_fast_sync_seconds": fast["sync_s"],
        "rlcore_fast_release_resume_s": fast["release_resume_s"],
    }
    (folder / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    totals = [fast["step_s"], defaults["step_s"], verl[2]["timing_s/step"]]
    totals += [fast_first["timing/step"], verl[1]["timing_s/step"]]
    draw(bars, folder / "phases.png", totals)


def draw(bars: dict[str, dict[str, float]], path: Path, totals: list[float] | None = None) -> None:
    """Stacked horizontal bars: one per run, one colour per phase, the step time (``totals``, default the
    phases' sum) at the end."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    keys = [*PHASES, "other"]
    for i, parts in enumerate(bars.values()):
        left = 0.0
        for j, key in enumerate(keys):
            value = parts.get(key, 0.0)
            ax.barh(i, value, left=left, color=f"C{j}", label=key if i == 0 else None)
            left += value
        ax.text(left + 2, i, f"{(totals[i] if totals else left):.1f} s", va="center")
    ax.set_yticks(range(len(bars)), list(bars))
    ax.set_xlim(0, ax.get_xlim()[1] * 1.12)  # room for the last label
    ax.invert_yaxis()
    ax.set_xlabel("seconds per GRPO step (64 prompts x 8 samples, 256 + 512 tokens, 0.5B shape, 1 H100)")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()

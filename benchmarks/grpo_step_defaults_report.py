"""Issue 35's ``grpo-step-defaults-vs-tuned-1gpu``: the pairs of ``step-defaults-vs-tuned`` runs into a
summary (per pair: default step / tuned step, the medians of steps 2-4; per arm: every timed step pooled)
and a chart of each run's phases.

    python benchmarks/grpo_step_defaults_report.py [--dir benchmarks/results/grpo_step/defaults-vs-tuned-h200]
        [--pair DEFAULTS:TUNED ...] [--first NAME ...]

Reads ``<name>_0.5B.json`` (``grpo_step_gpu.py``'s output) for the pairs (by default ``defaults``/``tuned``,
``defaults-rerun``/``tuned-rerun``, ``defaults-run3``/``tuned-run3``, those present; ``--pair`` names others)
and ``defaults-80gb``; writes ``summary.json`` and ``phases.png`` beside them. ``--first`` names the runs that
were the first on a fresh machine: the summary marks them and gives the ratio of the pairs where neither was,
because the first run on a machine was slower in every phase whichever settings it had (2026-11-29).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

PAIRS = (("defaults", "tuned"), ("defaults-rerun", "tuned-rerun"), ("defaults-run3", "tuned-run3"))
PHASES = ("generate", "ref_log_probs", "update_actor", "sync_weights")


def load(folder: Path, name: str) -> dict | None:
    path = folder / f"{name}_0.5B.json"
    return json.loads(path.read_text()) if path.is_file() else None


def timed(run: dict) -> list[dict]:
    """The steps after the first (which compiles and warms up)."""
    return run["rlcore_steps"][1:]


def arm(runs: list[dict]) -> dict:
    """Every timed step of an arm's runs pooled: step and phase medians with their ranges."""
    steps = [s for r in runs for s in timed(r)]
    out = {"steps": len(steps)}
    for key in ("step", *PHASES):
        values = [s[f"timing/{key}"] for s in steps if f"timing/{key}" in s]
        if not values:  # a phase these runs did not have (no reference model, say)
            continue
        out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path(__file__).parent / "results" / "grpo_step" / "defaults-vs-tuned-h200",
    )
    parser.add_argument(
        "--pair",
        action="append",
        metavar="DEFAULTS:TUNED",
        help="a pair of run names, defaults first (repeat; replaces the default pairs)",
    )
    parser.add_argument(
        "--first", action="append", default=[], metavar="NAME", help="a run that was its machine's first"
    )
    args = parser.parse_args()
    pair_names = [tuple(p.split(":", 1)) for p in args.pair] if args.pair else PAIRS
    names = [*dict.fromkeys(n for pair in pair_names for n in pair), "defaults-80gb"]
    found = {n: run for n in names if (run := load(args.dir, n)) is not None}
    pairs = []
    for d_name, t_name in pair_names:
        d, t = found.get(d_name), found.get(t_name)
        if d is None or t is None:
            continue
        pairs.append(
            {
                "pair": [d_name, t_name],
                "defaults_step_s": d["rlcore"]["step_s"],
                "tuned_step_s": t["rlcore"]["step_s"],
                "ratio": d["rlcore"]["step_s"] / t["rlcore"]["step_s"],
                "defaults_peak_gib": d["rlcore"]["peak_gpu_memory_gib"],
                "tuned_peak_gib": t["rlcore"]["peak_gpu_memory_gib"],
                "first_on_machine": [n for n in (d_name, t_name) if n in args.first],
            }
        )
    # Each arm's runs once, though a run may be in two pairs.
    defaults = [found[n] for n in dict.fromkeys(p["pair"][0] for p in pairs)]
    tuned = [found[n] for n in dict.fromkeys(p["pair"][1] for p in pairs)]
    ratios = [p["ratio"] for p in pairs]
    warm = [p["ratio"] for p in pairs if not p["first_on_machine"]]
    summary = {
        "pairs": pairs,
        "ratio_median": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
        "first_on_machine": args.first,
        "ratio_without_first_runs": {"median": statistics.median(warm), "values": warm} if warm else None,
        "defaults_pooled": arm(defaults),
        "tuned_pooled": arm(tuned),
    }
    small = found.get("defaults-80gb")
    if small is not None:
        summary["defaults_80gb"] = {
            "step_s": small["rlcore"]["step_s"],
            "peak_gib_without_the_held_memory": small["rlcore"]["peak_gpu_memory_gib"],
            "held_gib": small["rlcore"].get("held_gib"),
        }
    (args.dir / "summary.json").write_text(json.dumps(summary, indent=2))
    keys = ("pairs", "ratio_median", "ratio_range", "ratio_without_first_runs")
    print(json.dumps({k: summary[k] for k in keys}, indent=2))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [f"{n}\n(machine's first)" if n in args.first else n for n in found]
    runs = list(found.values())
    fig, ax = plt.subplots(figsize=(9, 4.5))
    bottom = [0.0] * len(runs)
    for phase in PHASES:
        values = [r["rlcore"]["phases_s"].get(phase, 0.0) for r in runs]
        ax.bar(names, values, bottom=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    rest = [r["rlcore"]["step_s"] - b for r, b in zip(runs, bottom, strict=True)]
    ax.bar(names, rest, bottom=bottom, label="other (release/resume, controller)", color="lightgrey")
    ax.set_ylabel("seconds per step (median of steps 2-4)")
    ax.set_title("GRPO step, 0.5B shape, one H200: rlcore's defaults vs the tuned fast path")
    ax.tick_params(axis="x", rotation=20)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.dir / "phases.png", dpi=120)


if __name__ == "__main__":
    main()

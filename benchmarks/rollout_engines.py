"""vLLM next to SGLang as rlcore rollout plugins: the rows users choose a rollout engine by.

Reads the JSON of ``benchmarks/vllm_gpu.py`` and ``benchmarks/sglang_gpu.py`` run in one device call on
the same GPU with the same arguments (``python -m benchmarks.gpu engines-bench``) and puts the plugins'
numbers side by side: generation tokens/s per batch size (median of the repeats, with the spread of the
runs), and colocated weight-sync seconds per model shape (median of the timed syncs, the first one left
out as warm-up, as both scripts report it), each next to the copy floor.

    python benchmarks/rollout_engines.py VLLM.json SGLANG.json [--out engines.json] [--plot engines.png]

Prints markdown rows ``| name | value | unit | hardware | command |``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

PLUGIN_KEYS = {"vllm": "rlcore vllm plugin", "sglang": "rlcore sglang plugin"}


def throughput(result: dict, engine: str) -> dict[int, dict]:
    """Per batch size: the plugin's median tok/s, its runs, and its ratio to the raw engine."""
    key = PLUGIN_KEYS[engine]
    out = {}
    for rec in result["throughput"]:
        runs = rec["runs"][key]
        out[rec["batch"]] = {
            "median": statistics.median(runs),
            "min": min(runs),
            "max": max(runs),
            "plugin_over_raw": rec["ratio_plugin_over_raw"],
        }
    return out


def sync(result: dict) -> dict[str, dict]:
    """Per model shape: the median sync seconds of the timed runs, the copy floor, bytes."""
    out = {}
    for rec in result["weight_sync"]:
        if "load_weights_runs_s" in rec:  # SGLang's, and vLLM's before direct writes (first run untimed)
            timed = rec["load_weights_runs_s"][1:] or rec["load_weights_runs_s"]
            gap = rec["logprob_gap_after_sync"]
        else:  # vLLM's ways (direct, reload, ipc): the fastest it has, already without the first run
            way = "direct" if "direct_s" in rec else "reload"
            timed, gap = rec[f"{way}_runs_s"], rec[f"logprob_gap_after_{way}"]
        out[rec["shape"]] = {
            "median_s": statistics.median(timed),
            "min_s": min(timed),
            "max_s": max(timed),
            "copy_floor_s": rec["copy_floor_s"],
            "measured_copy_s": rec["measured_copy_s"],
            "bytes": rec["bytes"],
            "logprob_gap_after_sync": gap,
        }
    return out


def compare(vllm: dict, sglang: dict) -> dict:
    tv, ts = throughput(vllm, "vllm"), throughput(sglang, "sglang")
    sv, ss = sync(vllm), sync(sglang)
    return {
        "hardware": {"vllm": vllm["hardware"], "sglang": sglang["hardware"]},
        "commands": {"vllm": vllm["command"], "sglang": sglang["command"]},
        "throughput": {
            batch: {
                "vllm": tv[batch],
                "sglang": ts[batch],
                "sglang_over_vllm": ts[batch]["median"] / tv[batch]["median"],
            }
            for batch in sorted(set(tv) & set(ts))
        },
        "weight_sync": {
            shape: {
                "vllm": sv[shape],
                "sglang": ss[shape],
                "sglang_over_vllm": ss[shape]["median_s"] / sv[shape]["median_s"],
            }
            for shape in sorted(set(sv) & set(ss))
        },
    }


def rows(table: dict, command: str) -> list[str]:
    hardware = table["hardware"]["vllm"].split(",")[0]
    versions = f"{hardware}; {table['hardware']['vllm'].split(', ', 1)[1]}; {table['hardware']['sglang'].split(', ', 1)[1]}"
    out = []
    for batch, rec in table["throughput"].items():
        for engine in ("vllm", "sglang"):
            r = rec[engine]
            out.append(
                f"| rollout-{engine}-plugin-tok-s-b{batch}-h100 | {r['median']:.0f} | tok/s, median of runs "
                f"{r['min']:.0f}-{r['max']:.0f} (plugin / raw {r['plugin_over_raw']:.3f}) | {versions} | `{command}` |"
            )
        out.append(
            f"| rollout-sglang-over-vllm-b{batch}-h100 | {rec['sglang_over_vllm']:.2f} | x, SGLang plugin tok/s / "
            f"vLLM plugin tok/s | {versions} | `{command}` |"
        )
    for shape, rec in table["weight_sync"].items():
        for engine in ("vllm", "sglang"):
            r = rec[engine]
            out.append(
                f"| rollout-{engine}-colocated-sync-{shape.lower()}-h100 | {r['median_s']:.3f} | s, median of "
                f"{r['min_s']:.3f}-{r['max_s']:.3f} (copy floor {r['copy_floor_s'] * 1e3:.2f} ms, copy_ "
                f"{r['measured_copy_s'] * 1e3:.1f} ms, log-prob gap after {r['logprob_gap_after_sync']:.4f}) "
                f"| {versions} | `{command}` |"
            )
    return out


def plot(table: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    batches = list(table["throughput"])
    for k, engine in enumerate(("vllm", "sglang")):
        recs = [table["throughput"][b][engine] for b in batches]
        xs = [i + (k - 0.5) * 0.38 for i in range(len(batches))]
        left.bar(xs, [r["median"] for r in recs], 0.38, label=f"rlcore-{engine}")
        left.errorbar(
            xs,
            [r["median"] for r in recs],
            yerr=[[r["median"] - r["min"] for r in recs], [r["max"] - r["median"] for r in recs]],
            fmt="none",
            color="black",
            capsize=3,
        )
    left.set_xticks(range(len(batches)), [f"batch {b}" for b in batches])
    left.set_ylabel("generated tokens / s")
    left.set_title("Generation, Qwen2.5-0.5B shape, 128+256 tokens")
    left.legend()
    shapes = list(table["weight_sync"])
    for k, engine in enumerate(("vllm", "sglang")):
        recs = [table["weight_sync"][s][engine] for s in shapes]
        right.bar(
            [i + (k - 0.5) * 0.38 for i in range(len(shapes))],
            [r["median_s"] for r in recs],
            0.38,
            label=f"rlcore-{engine}",
        )
    right.plot(
        range(len(shapes)),
        [table["weight_sync"][s]["vllm"]["copy_floor_s"] for s in shapes],
        "k_",
        markersize=30,
        label="copy floor",
    )
    right.set_xticks(range(len(shapes)), shapes)
    right.set_ylabel("seconds")
    right.set_title("Colocated weight sync")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("vllm", type=Path)
    parser.add_argument("sglang", type=Path)
    parser.add_argument(
        "--more-vllm", type=Path, nargs="*", default=[], help="more vllm_gpu.py JSON (sync rows)"
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    vllm = json.loads(args.vllm.read_text())
    for path in args.more_vllm:  # vLLM's 1.5B sync runs in a process of its own
        if path.exists():
            vllm["weight_sync"] += json.loads(path.read_text())["weight_sync"]
    table = compare(vllm, json.loads(args.sglang.read_text()))
    if args.out:
        args.out.write_text(json.dumps(table, indent=2))
    command = "python3 -m benchmarks.gpu engines-bench"
    print("\n".join(rows(table, command)))
    if args.plot:
        plot(table, args.plot)


if __name__ == "__main__":
    main()

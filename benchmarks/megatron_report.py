"""The Megatron-against-FSDP chart of ``docs/benchmarks.md`` from the GPU calls' raw files.

Reads the JSON of ``benchmarks/megatron_gpu.py`` and ``benchmarks/fsdp_train.py`` kept in
``benchmarks/results/megatron/`` (file names in :data:`ROWS`) and writes ``tokens_per_s.png`` there: per
model shape, training tokens/s per GPU of the Megatron engine before and after the packed-rotary fix and of
the FSDP engine beside it, with MFU on each bar. The same for the one-H100 call (:data:`H100_ROWS`,
``h100/``: Megatron compiled and eager, then FSDP, on one GPU) into ``h100/tokens_per_s.png``, and for the
2 x H200 session after the whole-layer compile (:data:`H200X2_ROWS`, ``h200x2/``: each engine run on both
GPUs at once, independently) into ``h200x2/tokens_per_s.png``, its second call (:data:`RUN2_ROWS`)
into ``h200x2-run2/tokens_per_s.png``, and the one-H100 call with the response-only head
(:data:`H100_RUN3_ROWS`, three runs of each engine one after another) into ``h100-run3/tokens_per_s.png``;
and the TP=2 scaling runs on 2 x H200 (:data:`SCALING_RUNS`) into ``h200x2-run4/scaling.png``, those with the
vocabulary-parallel head keeping its logits (:data:`KEEP_RUNS`) into ``h200x2-run5/scaling.png``.

    python benchmarks/megatron_report.py [--dir benchmarks/results/megatron]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

#: (shape, label) -> the result file; each holds one row (``results[0]``).
ROWS = {
    ("0.5B", "Megatron TP=1, before"): "h200-0.5b-tp1-before-rotary.json",
    ("0.5B", "Megatron TP=1, after"): "h200-0.5b-tp1.json",
    ("0.5B", "FSDP"): "h200-0.5b-fsdp-pair2.json",
    ("1.5B", "Megatron TP=1, before"): "h200-1.5b-tp1-before-rotary.json",
    ("1.5B", "Megatron TP=1, after"): "h200-1.5b-tp1.json",
    ("1.5B", "FSDP"): "h200-1.5b-fsdp-pair2.json",
}

#: The one-H100 call (the ``megatron-seq-*`` stages); a missing file is a run that did not finish (OOM).
H100_ROWS = {
    ("0.5B", "Megatron TP=1, compiled"): "h100/seq-0.5b-megatron-compile.json",
    ("0.5B", "Megatron TP=1, eager"): "h100/seq-0.5b-megatron-eager.json",
    ("0.5B", "FSDP"): "h100/seq-0.5b-fsdp.json",
    ("1.5B", "Megatron TP=1, compiled"): "h100/seq-1.5b-megatron-compile.json",
    ("1.5B", "Megatron TP=1, eager"): "h100/seq-1.5b-megatron-eager.json",
    ("1.5B", "FSDP"): "h100/seq-1.5b-fsdp.json",
}


def seq2_rows(megatron: str, fsdp: str) -> dict:
    """A ``megatron-seq2-*`` stage's files (Megatron's under ``megatron``, FSDP's under ``fsdp``):
    each row and its independent re-run, one per GPU."""
    return {
        (shape, f"{engine}, {run}"): f"{folder}{prefix}-{shape.lower()}-{suffix}.json"
        for shape in ("0.5B", "1.5B")
        for engine, folder, suffix in (
            ("Megatron TP=1 compiled", megatron, "megatron-compile"),
            ("FSDP", fsdp, "fsdp"),
        )
        for run, prefix in (("GPU 0", "seq"), ("GPU 1", "rerun"))
    }


#: The 2 x H200 session after the whole-layer compile.
H200X2_ROWS = seq2_rows("h200x2/", "h200x2/fsdp/")
#: Its second 2 x H200 call: Megatron keeping the head's logits, rotary once per micro-batch, half the cores each.
RUN2_ROWS = seq2_rows("h200x2-run2/", "h200x2-run2/")
#: One H100, the head on response positions only: each engine three times (0.5B) or twice (1.5B), in turn.
H100_RUN3_ROWS = {
    (shape, f"{engine}, run {k}"): f"h100-run3/{prefix}-{shape.lower()}-{suffix}.json"
    for shape in ("0.5B", "1.5B")
    for engine, suffix in (("Megatron TP=1 compiled", "megatron-compile"), ("FSDP", "fsdp"))
    for k, prefix in enumerate(("seq", "rerun", "run3"), start=1)
}


#: The 2 x H200 call on TP=2 scaling (``h200x2-run4/``): (label, TP=2 file, the TP=1 file it is divided by,
#: run on GPU 0 of the same machine minutes apart). ``run3/`` is a second machine's call.
SCALING_RUNS = [
    ("0.5B, 16k\nrun 1", "tp2-only-0.5b.json", "tp1-0.5b.json"),
    ("0.5B, 16k\nrun 2", "tp2-only-rerun-0.5b.json", "rerun/tp1-0.5b-rerun.json"),
    ("0.5B, 32k\nrun 1", "mb32k-tp2.json", "tp1-0.5b.json"),
    ("0.5B, 32k\nrun 2", "rerun/mb32k-tp2-rerun.json", "rerun/tp1-0.5b-rerun.json"),
    ("0.5B, 32k\n2nd machine", "run3/mb32k-tp2-run3.json", "run3/tp1-0.5b-run3.json"),
    ("1.5B, 16k\nrun 1", "tp2-1.5b-only.json", "tp1-1.5b.json"),
    ("1.5B, 16k\nrun 2", "tp2-1.5b-rerun.json", "tp1-1.5b.json"),
]

#: ``h200x2-run5/``: TP=2 at 32,768-token micro-batches with the vocabulary-parallel head keeping each
#: rank's logits (``tp2-keep-*``), each against TP=1 of the same call; call 2 on a fresh machine, call 3
#: right after it on the same one.
KEEP_RUNS = [
    ("0.5B\ncall 1", "call1/tp2-keep-0.5b.json", "call1/tp1-0.5b.json"),
    ("0.5B\ncall 2", "call2/tp2-keep-0.5b.json", "call2/tp1-0.5b.json"),
    ("1.5B\ncall 1", "call1/tp2-keep-1.5b.json", "call1/tp1-1.5b.json"),
    ("1.5B\ncall 2", "call2/tp2-keep-1.5b.json", "call2/tp1-1.5b.json"),
    ("1.5B\ncall 3", "call3/tp2-keep-1.5b.json", "call3/tp1-1.5b.json"),
]


def scaling(folder: Path, tp2: str, tp1: str) -> float:
    """TP=2 tokens/s over both GPUs / (2 x TP=1 tokens/s): 1.0 is perfect scaling."""
    return result(folder / tp2)["tokens_per_s"] / (2 * result(folder / tp1)["tokens_per_s"])


def result(path: Path) -> dict:
    """The one row of a ``megatron_gpu.py`` / ``fsdp_train.py`` result file."""
    return json.loads(path.read_text())["results"][0]


def scaling_chart(folder: Path, runs: list, title: str, out: Path, goal: float = 0.85) -> None:
    """One bar per run of ``runs``: TP=2 scaling efficiency (:func:`scaling`, in %), the goal as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = [100 * scaling(folder, tp2, tp1) for _, tp2, tp1 in runs]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    bars = ax.bar(range(len(runs)), values, color=["C0" if v >= 100 * goal else "C1" for v in values])
    for bar, value in zip(bars, values, strict=True):
        ax.annotate(f"{value:.1f}%", (bar.get_x() + bar.get_width() / 2, value), ha="center", va="bottom")
    ax.axhline(100 * goal, color="k", linestyle="--", linewidth=1, label=f"goal {100 * goal:.0f}%")
    ax.set_xticks(range(len(runs)), [label for label, _, _ in runs], fontsize=8)
    ax.set_ylabel("TP=2 scaling efficiency (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default=str(Path(__file__).resolve().parent / "results" / "megatron"))
    folder = Path(p.parse_args().dir)
    chart(folder, ROWS, "Megatron vs FSDP engine, one H200 each, same workload", folder / "tokens_per_s.png")
    chart(
        folder,
        H100_ROWS,
        "Megatron vs FSDP engine, one after another on one H100",
        folder / "h100" / "tokens_per_s.png",
    )
    chart(
        folder,
        H200X2_ROWS,
        "Megatron (whole-layer compile) vs FSDP, each on both GPUs of a 2 x H200 host",
        folder / "h200x2" / "tokens_per_s.png",
    )
    chart(
        folder,
        RUN2_ROWS,
        "Megatron (logits kept, rotary once) vs FSDP, each on both GPUs of a 2 x H200 host",
        folder / "h200x2-run2" / "tokens_per_s.png",
    )
    chart(
        folder,
        H100_RUN3_ROWS,
        "Megatron (head on response positions) vs FSDP, in turn on one H100",
        folder / "h100-run3" / "tokens_per_s.png",
        missing="not run",
    )
    for sub, runs, title in (
        (
            "h200x2-run4",
            SCALING_RUNS,
            "Megatron TP=2 on 2 x H200 against TP=1 on one of them (micro-batch tokens)",
        ),
        ("h200x2-run5", KEEP_RUNS, "Megatron TP=2 (logits kept, 32k micro-batches) on 2 x H200 against TP=1"),
    ):
        for label, tp2, tp1 in runs:
            print(f"{sub} {label.replace(chr(10), ' ')}: {100 * scaling(folder / sub, tp2, tp1):.1f}%")
        scaling_chart(folder / sub, runs, title, folder / sub / "scaling.png")


def chart(folder: Path, table: dict, title: str, out: Path, missing: str = "out of memory") -> None:
    """Grouped bars: tokens/s per GPU per (shape, system) of ``table``, MFU on each bar; a file that is
    not there is labelled ``missing``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = sorted({shape for shape, _ in table})
    labels = list(dict.fromkeys(label for _, label in table))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(labels)
    for k, label in enumerate(labels):
        paths = [folder / table[shape, label] for shape in shapes]
        rows = [result(path) if path.exists() else None for path in paths]
        xs = [i + (k - (len(labels) - 1) / 2) * width for i in range(len(shapes))]
        bars = ax.bar(xs, [r["tokens_per_s"] / 1000 if r else 0.0 for r in rows], width, label=label)
        for bar, row in zip(bars, rows, strict=True):
            ax.annotate(
                f"{100 * row['mfu']:.0f}% MFU" if row else missing,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
    ax.set_xticks(range(len(shapes)), [f"Qwen2.5-{s} shape" for s in shapes])
    ax.set_ylabel("training tokens/s per GPU (thousands)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

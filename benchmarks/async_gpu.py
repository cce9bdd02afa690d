"""Synchronous against overlapping GRPO training on the same GPUs, on a long-tail workload (issue 34).

The workload: a random Qwen2.5-0.5B- or 1.5B-shaped model (``vllm_gpu.SHAPES``, bf16 checkpoint,
word-level tokenizer whose tokens are the words ``t0 .. t151933``), ``PROMPTS`` prompts of 256 random
tokens per step, ``rollout.n=8``, responses of at most ``--max-response`` tokens at temperature 1,
reference model on (KL loss 0.001), one PPO epoch of one mini-batch, fp32 trainer with bf16 mixed
precision, bf16 generation. With random weights the end-of-sequence token almost never comes (one
token in 151,936: about 1% of 2048-token responses), so the response lengths are made by **stop
strings**: vLLM ends a response when a stop string appears in its detokenized text (a substring test
on the text generated so far). vLLM detokenizes with the tokenizer of the model folder, which
transformers 5 loads as Qwen2's byte-level BPE beside a Qwen2 config: it decodes the words with no
space between them (``t5t170t300``; the word-level tokenizer of ``model.tokenizer_path`` would give
``t5 t170 t300``). Every word starts with ``t`` and holds digits only after it, so the stop string
``"t170"`` matches in either text exactly where a token's word starts with 170 (``t170``,
``t1700 .. t1709``, ``t17000 .. t17099``: 111 of the 151,934 words), and ``STOP = ["t170", "t171"]``
at 222 of them: a near-uniform sampler stops at each token with probability p ~ 1/684, a geometric
length distribution (mean 684, median 475) cut at the cap (2048: mean ~650, about 5% of the responses
reach the cap), the long tail of reasoning RL. (The first GPU attempt used ``" t170"``, with a space,
which the byte-level text never holds: nearly every response ran to the cap.) The lengths measured
are reported (``response_length/*`` of each step).

Configurations (``--config``), on ``--gpus`` GPUs, ``--rollout-gpus`` of them the rollout's when split:

- ``colocated-sync``: every role on every GPU (``actor.world_size = rollout.num_engines = gpus``),
  generate / train / sync in turn, memory released and resumed around each phase;
- ``split-sync``: ``trainer.placement=split``, the rollout on its own GPUs, still in turn;
- ``one-step-off``: split, ``trainer.mode=one_step_off`` (staleness 1);
- ``async``: split, ``trainer.mode=async trainer.max_staleness=2 trainer.partial_rollout=true``
  (chunks of ``trainer.rollout_chunk_tokens=512``);
- ``async-s2``: split, ``trainer.mode=async trainer.max_staleness=2`` without partial rollouts;
- ``colocated-stream``: every role on every GPU (also ``--gpus 1``), ``trainer.mode=stream``: rollouts that
  outlive a step on the one shared pool, everything of the mode at its defaults
  (``trainer.stream.over_sampling``, ``trainer.stream.policy``, ``trainer.max_staleness``,
  ``trainer.rollout_chunk_tokens``: core resolves them).

Every run uses the same training settings (``TUNED``: the FSDP fast path of the GRPO step rows without
``fsdp.compile``, and ``grpo_step_gpu.SETTINGS``: precision, packing, the rollout's dtype and memory share)
unless ``--defaults``: then the command holds the workload, the placement and GPU counts and the mode alone,
and ``rlcore train`` decides the rest as a user's run does (``colocated-stream-vs-sync-throughput-*-1gpu``:
"at the defaults except the mode").

Length of a run: ``--steps`` steps are timed. With ``--total-steps`` above it (``trainer.total_steps``),
the run is stopped (SIGINT, as Ctrl-C) once ``--steps`` steps are logged: no end-of-run checkpoint, and no
last step in which a stream drains its groups in flight. ``--max-response`` caps the geometric lengths
(2048 by default; 8192: mean ~684, essentially none at the cap, the longest of 64 responses ~3,240 on
average: ``expected_lengths`` reports the distribution for the cap and the step's responses).

The metric is trained tokens per second: prompt + response tokens of the trained batches (``tokens/total``)
over the wall seconds of the steady-state steps (steps ``--steady-from`` .. ``--steps``; ``timing/step``,
which in the overlapping modes is the wall time between the ends of consecutive steps). Reported: that
aggregate, and the median, min and max of the per-step values. Each run writes
``<out>/<run>_<shape>.json`` (summary and every step's metrics) and copies the run's ``timeline.jsonl`` and
``timeline.png`` beside it; ``<out>/comparison_<shape>.json`` gathers every run of the shape and compares
the best synchronous configuration with the best overlapping one, and ``colocated-stream`` with
``colocated-sync`` (trained tokens per second, streaming / synchronous: the rows
``colocated-stream-vs-sync-throughput-<shape>-<gpus>gpu``). Metrics named ``stream/*`` (the stream mode's
own) are kept with the medians of every run that logs them.

    python benchmarks/async_gpu.py --shape 0.5B --config colocated-sync --out /tmp/res/async
    python benchmarks/async_gpu.py --shape 0.5B --config one-step-off --out /tmp/res/async
    python benchmarks/async_gpu.py --report --shape 0.5B --out /tmp/res/async
    python benchmarks/async_gpu.py --dry-run --config async --out /tmp/x   # print the command only
    python benchmarks/async_gpu.py --dry-run --config colocated-stream --gpus 1 --defaults --prompts 8 \
        --max-response 8192 --steps 3 --total-steps 5 --out /tmp/x
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PROMPT_LEN, N, PROMPTS = 256, 8, 128
MAX_RESPONSE = 2048
STOP = ("t170", "t171")
#: The words a sampler draws (``t0 .. t151933``; the other two ids are the special tokens).
WORDS = 151934

#: The FSDP fast path of the GRPO step rows (docs/benchmarks.md, round 4) without ``fsdp.compile``
#: (its compile lands in the first steps of every run), for every configuration alike.
TUNED = (
    "fsdp.reshard_after_forward=false",
    "fsdp.reduce_grads_once_per_step=true",
    "fsdp.logits_chunk_size=4096",
    "fsdp.recompute_logits=false",
    "actor.max_tokens_per_micro_batch=16384",
)
SPLIT = ("trainer.placement=split",)
CONFIGS: dict[str, dict] = {
    "colocated-sync": {"placement": "colocated", "mode": ("trainer.mode=sync",)},
    "split-sync": {"placement": "split", "mode": ("trainer.mode=sync",)},
    "one-step-off": {"placement": "split", "mode": ("trainer.mode=one_step_off",)},
    "async": {
        "placement": "split",
        "mode": (
            "trainer.mode=async",
            "trainer.max_staleness=2",
            "trainer.partial_rollout=true",
            "trainer.rollout_chunk_tokens=512",
        ),
    },
    "async-s2": {"placement": "split", "mode": ("trainer.mode=async", "trainer.max_staleness=2")},
    # The stream mode's own keys (trainer.stream.over_sampling, .policy, max_staleness, rollout_chunk_tokens)
    # are left to core: the rows compare the mode at its defaults.
    "colocated-stream": {"placement": "colocated", "mode": ("trainer.mode=stream",)},
}
SYNC, STREAM = "colocated-sync", "colocated-stream"
#: The row that compares them (``stream_vs_sync``), by shape and GPU count.
STREAM_ROW = "colocated-stream-vs-sync-throughput-{shape}-{gpus}gpu"
#: Metric prefixes whose every key is kept with the medians (besides ``KEPT``): the stream mode's own.
KEPT_PREFIXES = ("stream/",)
#: Seconds a stopped run (``--total-steps`` above ``--steps``) gets to wind down before it is killed.
STOP_GRACE_S = 20
#: Per-step metrics kept in the summary (medians over the steady steps).
KEPT = (
    "timing/step",
    "timing/generate",
    "timing/collect",
    "timing/score",
    "timing/old_log_probs",
    "timing/ref_log_probs",
    "timing/update_actor",
    "timing/sync_weights",
    "timing/wait_rollout",
    "timing/release_resume",
    "sync/seconds",
    "tokens/total",
    "tokens/response",
    "response_length/mean",
    "response_length/max",
    "response_length/min",
    "response_length/clip_ratio",
    "off_policy/staleness_mean",
    "off_policy/staleness_max",
    "off_policy/multi_version_fraction",
    "off_policy/is_weight_mean",
    "off_policy/is_clipped_fraction",
)


def stop_words(stop: tuple[str, ...] = STOP, words: int = WORDS) -> int:
    """How many words end a response: those ``t<id>`` that start with a stop string (each word starts
    with ``t`` and has no other letter, so a stop string ``t<digits>`` can match nowhere else)."""
    return sum(any(f"t{i}".startswith(s) for s in stop) for i in range(words))


def expected_lengths(
    cap: int, stop: tuple[str, ...] = STOP, words: int = WORDS, responses: int | None = None
) -> dict:
    """The geometric length distribution the stop strings give a uniform sampler, cut at ``cap``; with
    ``responses`` (a step's), also the mean of the step's longest response: what a synchronous step's
    generation waits for."""
    k = stop_words(stop, words)
    p = k / words
    mean = (1 - (1 - p) ** cap) / p  # E[min(G, cap)], G ~ Geometric(p) on 1, 2, ...
    out = {
        "cap": cap,
        "stop_words": k,
        "p_stop_per_token": p,
        "mean_uncapped": 1 / p,
        "mean": mean,
        "at_cap_fraction": (1 - p) ** (cap - 1),
        "median_uncapped": _geometric_quantile(p, 0.5),
        "p90_uncapped": _geometric_quantile(p, 0.9),
        "p99_uncapped": _geometric_quantile(p, 0.99),
    }
    if responses:
        # E[max of n] = sum over l < cap of P(max > l), P(one <= l) = 1 - (1 - p)^l
        out["responses_per_step"] = responses
        out["longest_of_step_mean"] = sum(1 - (1 - (1 - p) ** n) ** responses for n in range(cap))
    return out


def _geometric_quantile(p: float, q: float) -> int:
    return math.ceil(math.log(1 - q) / math.log(1 - p))


_WRITE_MODEL = """
import sys
from pathlib import Path

import torch

sys.path.insert(0, sys.argv[1])
from vllm_gpu import save_model, word_level_tokenizer

save_model(Path(sys.argv[2]), sys.argv[3], torch.device("cuda" if torch.cuda.is_available() else "cpu"))
word_level_tokenizer().save_pretrained(sys.argv[4])
"""


def write_inputs(out: Path, shape: str, rows: int) -> dict:
    """The model folder, tokenizer, prompt file and reward (``grpo_step_gpu``'s, more prompts per step)."""
    from grpo_step_gpu import REWARD

    model, tokenizer = out / f"qwen2-{shape}", out / "tokenizer"
    data, reward = out / f"prompts_{rows}.jsonl", out / "reward.py"
    if not (model / "config.json").exists() or not (tokenizer / "tokenizer.json").exists():
        # In a process of its own: building the model on the GPU would keep a CUDA context (and the
        # allocator's cache) in this process for the whole run.
        here = str(Path(__file__).resolve().parent)
        subprocess.run(
            [sys.executable, "-c", _WRITE_MODEL, here, str(model), shape, str(tokenizer)], check=True
        )
    if not data.exists():
        rng = random.Random(0)
        lines = [
            {
                "data_source": "synthetic",
                "prompt": " ".join(f"t{rng.randrange(WORDS)}" for _ in range(PROMPT_LEN)),
                "reward_model": {"style": "rule", "ground_truth": ""},
            }
            for _ in range(rows)
        ]
        data.write_text("".join(json.dumps(r) + "\n" for r in lines))
    reward.write_text(REWARD)
    return {"model": model, "tokenizer": tokenizer, "data": data, "reward": reward}


def overrides(config: str, gpus: int, rollout_gpus: int, tuned: bool) -> list[str]:
    """The rlcore overrides of ``config`` on ``gpus`` GPUs (``rollout_gpus`` of them the rollout's when
    split). ``tuned=False`` (``--defaults``): the placement, the GPU counts and the mode alone, no memory
    share."""
    spec = CONFIGS[config]
    if spec["placement"] == "colocated":
        # vLLM's share of each GPU (KV cache for 256 x 2304 tokens is ~7 GB at 0.5B): the train roles keep
        # theirs (as the GRPO step rows' fast path).
        place = [
            "trainer.placement=colocated",
            f"actor.world_size={gpus}",
            f"rollout.num_engines={gpus}",
            *(("rollout.gpu_memory_utilization=0.3",) if tuned else ()),
        ]
    else:
        if not 0 < rollout_gpus < gpus:
            raise SystemExit(f"--rollout-gpus must be between 1 and {gpus - 1}, got {rollout_gpus}")
        place = [
            *SPLIT,
            f"actor.world_size={gpus - rollout_gpus}",
            f"rollout.num_engines={rollout_gpus}",
            # the rollout's GPUs are its own
            *(("rollout.gpu_memory_utilization=0.7",) if tuned else ()),
        ]
    return [*place, *spec["mode"], *(TUNED if tuned else ())]


def rlcore_command(inputs: dict, args: argparse.Namespace, run_dir: Path) -> list[str]:
    """``grpo_step_gpu``'s ``rlcore train`` command at this workload's size, with the stop strings and the
    configuration's overrides after it (later keys win: placement, mode, GPUs)."""
    from grpo_step_gpu import rlcore_command as step_command

    stop = "[" + ",".join(f"'{s}'" for s in STOP) + "]"
    extra = [
        f"rollout.stop={stop}",
        *overrides(args.config, args.gpus, args.rollout_gpus, not args.defaults),
        *args.overrides,
    ]
    return step_command(
        inputs,
        total_steps(args),
        run_dir.parent.parent,
        extra,
        run_dir.name,
        prompts=args.prompts,
        response_len=args.max_response,
        defaults=args.defaults,
    )


def total_steps(args: argparse.Namespace) -> int:
    """``trainer.total_steps``: ``--total-steps``, else ``--steps`` (the run then ends by itself)."""
    return max(args.total_steps or args.steps, args.steps)


def _stats(values: list[float]) -> dict:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def kept_keys(steps: list[dict]) -> list[str]:
    """``KEPT``, then every numeric key of ``KEPT_PREFIXES`` (``stream/*``) that a step logs, sorted."""
    extra = {k for s in steps for k, v in s.items() if k.startswith(KEPT_PREFIXES) and _number(v)}
    return [k for k in KEPT if any(_number(s.get(k)) for s in steps)] + sorted(extra - set(KEPT))


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def summarize(steps: list[dict], steady_from: int) -> dict:
    """Trained tokens per second over the steady steps (``step >= steady_from``), and what made them."""
    steady = [s for s in steps if s["step"] >= steady_from] or steps[-1:]
    per_step = [s["tokens/total"] / s["timing/step"] for s in steady]
    tokens = sum(s["tokens/total"] for s in steady)
    wall = sum(s["timing/step"] for s in steady)
    out = {
        "steady_steps": [s["step"] for s in steady],
        "tokens_per_s": tokens / wall,
        "tokens_per_s_per_step": _stats(per_step),
        "tokens_per_s_steps": per_step,
        "step_s": _stats([s["timing/step"] for s in steady]),
        "medians": {
            k: statistics.median(s[k] for s in steady if _number(s.get(k))) for k in kept_keys(steady)
        },
        "response_length": {
            "mean_of_steps": statistics.mean(s["response_length/mean"] for s in steady),
            "mean_by_step": [s.get("response_length/mean") for s in steps],
            "max": max(s.get("response_length/max", 0) for s in steps),
            "min": min(s.get("response_length/min", 0) for s in steps),
            "at_cap_fraction_mean": statistics.mean(s.get("response_length/clip_ratio", 0) for s in steps),
        },
    }
    return out


def compare(runs: dict[str, dict], shape: str | None = None, gpus: int | None = None) -> dict:
    """Per configuration the median over its runs; the best synchronous against the best overlapping;
    with both ``colocated-stream`` and ``colocated-sync`` runs, their comparison (:func:`stream_vs_sync`)."""
    by_config: dict[str, list[float]] = {}
    for r in runs.values():
        by_config.setdefault(r["config"], []).append(r["tokens_per_s"])
    medians = {c: statistics.median(v) for c, v in by_config.items()}
    sync = {c: v for c, v in medians.items() if CONFIGS[c]["mode"] == ("trainer.mode=sync",)}
    overlap = {c: v for c, v in medians.items() if c not in sync}
    out: dict = {"tokens_per_s_by_config": medians, "runs_by_config": by_config}
    if sync and overlap:
        best_sync, best_overlap = max(sync, key=sync.get), max(overlap, key=overlap.get)
        out.update(
            best_sync=best_sync,
            best_overlap=best_overlap,
            ratio=overlap[best_overlap] / sync[best_sync],
        )
    streamed = stream_vs_sync(runs, shape, gpus)
    if streamed:
        out["stream_vs_sync"] = streamed
    return out


def stream_vs_sync(runs: dict[str, dict], shape: str | None, gpus: int | None) -> dict:
    """``colocated-stream`` against ``colocated-sync``: trained tokens per second, streaming / synchronous,
    the median over each one's runs (the row ``colocated-stream-vs-sync-throughput-<shape>-<gpus>gpu``), and
    each pair's own ratio: run k of one against run k of the other (``-r2`` against ``-r2``), so a pair
    whose sync run was the machine's first (slower on some fresh machines: benchmarks/gpu/README.md) can
    be told from the other. Runs cut by their timeout (``partial``) are named."""
    stream = {n: r for n, r in runs.items() if r["config"] == STREAM}
    sync = {n: r for n, r in runs.items() if r["config"] == SYNC}
    if not stream or not sync:
        return {}
    s = statistics.median(r["tokens_per_s"] for r in stream.values())
    y = statistics.median(r["tokens_per_s"] for r in sync.values())
    pairs = {}
    for name, r in sorted(stream.items()):
        twin = SYNC + name[len(STREAM) :]  # colocated-stream-r2 -> colocated-sync-r2
        if twin in sync:
            pairs[f"{name} / {twin}"] = r["tokens_per_s"] / sync[twin]["tokens_per_s"]
    return {
        "row": STREAM_ROW.format(shape=shape.lower(), gpus=gpus) if shape and gpus else None,
        "metric": "trained tokens per second, streaming / synchronous",
        "ratio": s / y,
        "stream_tokens_per_s": s,
        "sync_tokens_per_s": y,
        "tokens_per_s_by_run": {n: r["tokens_per_s"] for n, r in sorted({**sync, **stream}.items())},
        "ratio_by_pair": pairs,
        "partial_runs": sorted(n for n, r in {**sync, **stream}.items() if r.get("partial")),
    }


def draw_timeline(out: Path, stem: str, title: str) -> None:
    """``<stem>_timeline.png`` from ``<stem>_timeline.jsonl`` where the run ended before ``rlcore train``
    drew it (a run cut by its timeout)."""
    source, picture = out / f"{stem}_timeline.jsonl", out / f"{stem}_timeline.png"
    if source.is_file() and not picture.is_file():
        from rlcore.telemetry.timeline import plot_timeline, read_timeline

        plot_timeline(read_timeline(source), picture, title=title)


def _entry(config: str, summary: dict, **extra) -> dict:
    keep = ("tokens_per_s", "tokens_per_s_per_step", "step_s", "steady_steps", "response_length", "medians")
    return {"config": config, **{k: summary[k] for k in keep}, **extra}


#: The gathered file's prefix. It was ``async_``, the ``async`` configuration's own prefix, so that run's
#: results were overwritten by the comparison and left out of it (4 x H200, 2026-11-28).
COMPARISON = "comparison_"


def gather(out: Path, shape: str, partial_from: int | None = None) -> dict:
    """``comparison_<shape>.json``: every finished run of the shape (summaries) and the comparison (not
    ``async_<shape>.json``, which is the ``async`` configuration's own run file). With
    ``partial_from``, also the runs that did not finish (cut by their timeout), from the steps they
    logged (``runs/<run>_<shape>/metrics.jsonl`` or ``<run>_<shape>_metrics.jsonl``), steps
    ``partial_from`` and later: flagged ``partial``."""
    runs = {}
    for path in sorted(out.glob(f"*_{shape}.json")):
        if path.name.startswith(COMPARISON):
            continue
        data = json.loads(path.read_text())
        if "summary" in data:
            runs[data["run"]] = _entry(data["config"], data["summary"], wall_s=data["wall_s"])
    if partial_from is not None:
        found = [*out.glob(f"runs/*_{shape}/metrics.jsonl"), *out.glob(f"*_{shape}_metrics.jsonl")]
        for metrics in sorted(found):
            stem = (
                metrics.parent.name
                if metrics.name == "metrics.jsonl"
                else metrics.name[: -len("_metrics.jsonl")]
            )
            run = stem[: -len(f"_{shape}")]
            config = run.rsplit("-r", 1)[0] if run not in CONFIGS else run
            steps = [r for r in map(json.loads, metrics.open()) if "timing/step" in r]
            steady = [s for s in steps if s["step"] >= partial_from]
            if run in runs or config not in CONFIGS or not steady:
                continue
            runs[run] = _entry(config, summarize(steps, partial_from), partial=True, steps_logged=len(steps))
            draw_timeline(out, stem, f"{stem} ({CONFIGS[config]['mode'][0]}), cut by its timeout")
    load = workload(out, shape)
    result = {
        "shape": shape,
        "workload": load,
        "runs": runs,
        "comparison": compare(runs, shape, load.get("gpus")) if runs else {},
    }
    name = f"{COMPARISON}{shape}.json" if partial_from is None else f"{COMPARISON}{shape}_partial.json"
    (out / name).write_text(json.dumps(result, indent=2))
    return result


def workload(out: Path, shape: str) -> dict:
    for path in sorted(out.glob(f"*_{shape}.json")):
        data = json.loads(path.read_text())
        if "workload" in data and not path.name.startswith(COMPARISON):
            return data["workload"]
    return {}


def copy_timeline(run_dir: Path, out: Path, stem: str) -> None:
    """The run's timeline (jsonl and png) and resolved config beside its JSON: the harness brings back
    nothing of a run folder but its metrics."""
    for name, dest in (
        ("timeline.jsonl", f"{stem}_timeline.jsonl"),
        ("timeline.png", f"{stem}_timeline.png"),
        ("config.yaml", f"{stem}_config.txt"),
        ("stream.jsonl", f"{stem}_stream.jsonl"),  # trainer.mode=stream: each group's life
        ("stream.png", f"{stem}_stream.png"),
    ):
        if (run_dir / name).is_file():
            shutil.copyfile(run_dir / name, out / dest)


def run_train(command: list[str], log: Path, metrics: Path, timeout: float, stop_after: int) -> dict:
    """``rlcore train`` into ``log``: its exit status (``"timeout"`` when ``timeout`` seconds ran out) and,
    with ``stop_after``, whether it was stopped (SIGINT, as Ctrl-C) once that many steps were logged.
    A run that does not wind down within ``STOP_GRACE_S`` of its stop, or that ran out of time, is killed
    and its Ray cluster stopped (the next run would join it)."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    started = time.perf_counter()
    stopped: float | None = None
    killed = False
    code: int | str | None = None
    with log.open("w") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
        try:
            while proc.poll() is None:
                now = time.perf_counter()
                if now - started > timeout:
                    code = "timeout"
                    break
                if stop_after and stopped is None and _steps_logged(metrics) >= stop_after:
                    proc.send_signal(signal.SIGINT)
                    stopped = now
                if stopped is not None and now - stopped > STOP_GRACE_S:
                    killed = True
                    break
                time.sleep(0.5)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                killed = True
    if killed:
        subprocess.run(
            [sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], check=False, capture_output=True
        )
    return {
        "exit": code if code is not None else proc.returncode,
        "stopped_after": stop_after if stopped is not None else None,
        "killed": killed,
        "wall_s": time.perf_counter() - started,
    }


def _steps_logged(metrics: Path) -> int:
    if not metrics.is_file():
        return 0
    return sum('"timing/step"' in line for line in metrics.read_text().splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="0.5B", choices=("0.5B", "1.5B"))
    parser.add_argument("--config", default="colocated-sync", choices=sorted(CONFIGS))
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--rollout-gpus", type=int, default=2, help="the rollout's GPUs when split")
    parser.add_argument("--steps", type=int, default=5, help="steps timed")
    parser.add_argument(
        "--total-steps",
        type=int,
        default=None,
        help="trainer.total_steps (default --steps); above --steps, the run stops once --steps are logged",
    )
    parser.add_argument("--steady-from", type=int, default=3, help="first step of the steady state")
    parser.add_argument("--prompts", type=int, default=PROMPTS, help="prompts per step")
    parser.add_argument(
        "--max-response",
        type=int,
        default=MAX_RESPONSE,
        help="response cap (up to 8192 for the long tail: mean ~684, the stop strings' geometric lengths)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="run number (2: the run's independent repeat)")
    parser.add_argument(
        "--defaults",
        action="store_true",
        help="the workload, placement, GPU counts and mode alone: neither TUNED nor grpo_step_gpu.SETTINGS "
        "nor a memory share (rlcore train decides them)",
    )
    parser.add_argument(
        "--timeout", type=float, default=400, help="seconds for the whole run, inputs included"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--report", action="store_true", help="only gather the shape's runs and compare")
    parser.add_argument(
        "--partial",
        action="store_true",
        help="with --report: also runs cut by their timeout, from their logged steps >= --steady-from",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the rlcore command, run nothing")
    parser.add_argument("overrides", nargs="*", help="more rlcore key=value overrides")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report:
        gathered = gather(args.out, args.shape, args.steady_from if args.partial else None)
        print(json.dumps({"runs": gathered["runs"], "comparison": gathered["comparison"]}, indent=2))
        return
    run = args.config + ("" if args.repeat == 1 else f"-r{args.repeat}")
    stem = f"{run}_{args.shape}"
    run_dir = args.out / "runs" / stem
    total = total_steps(args)
    # Every step's prompts and two batches more (a stream's groups in flight beyond the batch), so that no
    # run wraps around its data before its last step.
    rows = args.prompts * (total + 2)
    lengths = expected_lengths(args.max_response, responses=args.prompts * N)
    if args.dry_run:
        inputs = {
            "model": args.out / f"qwen2-{args.shape}",
            "tokenizer": args.out / "tokenizer",
            "data": args.out / f"prompts_{rows}.jsonl",
            "reward": args.out / "reward.py",
        }
        print(" ".join(map(str, rlcore_command(inputs, args, run_dir))))
        print(json.dumps(lengths, indent=2))
        return
    began = time.perf_counter()
    inputs = write_inputs(args.out, args.shape, rows)
    command = rlcore_command(inputs, args, run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    log = args.out / f"{stem}_train.log"
    metrics = run_dir / "metrics.jsonl"
    ran = run_train(
        command,
        log,
        metrics,
        # --timeout bounds the whole script (the harness's limit): the inputs took some of it
        max(1.0, args.timeout - (time.perf_counter() - began)),
        args.steps if total > args.steps else 0,
    )
    code = ran["exit"]
    copy_timeline(run_dir, args.out, stem)
    steps = [r for r in map(json.loads, metrics.open()) if "timing/step" in r] if metrics.is_file() else []
    if ran["stopped_after"]:
        steps = steps[: args.steps]
    result = {
        "run": run,
        "config": args.config,
        "shape": args.shape,
        "command": " ".join(map(str, command)),
        "exit": code,
        "stopped_after": ran["stopped_after"],
        "killed": ran["killed"],
        "wall_s": ran["wall_s"],
        "workload": {
            "prompt": PROMPT_LEN,
            "n": N,
            "prompts_per_step": args.prompts,
            "max_response": args.max_response,
            "stop": list(STOP),
            "expected_lengths": lengths,
            "gpus": args.gpus,
            "rollout_gpus_when_split": args.rollout_gpus,
            "tuned": not args.defaults,
            "defaults": args.defaults,
            "steps_timed": args.steps,
            "total_steps": total,
            "steady_from": args.steady_from,
        },
        "steps": steps,
    }
    ok = (code == 0 or ran["stopped_after"] is not None) and bool(steps)
    if ok:
        result["summary"] = summarize(steps, args.steady_from)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2))
    if not ok:
        tail = log.read_text(errors="replace").splitlines()[-40:]
        raise SystemExit(f"rlcore train failed ({code}):\n" + "\n".join(tail))
    gathered = gather(args.out, args.shape)
    print(json.dumps({"run": run, **result["summary"], "comparison": gathered["comparison"]}, indent=2))


if __name__ == "__main__":
    main()

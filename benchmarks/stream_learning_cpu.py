"""The stream against synchronous training on the built-in task, over many seeds (the margin behind
``tests/test_e2e_stream.py::test_the_stream_learns_like_the_synchronous_run_over_three_seeds``).

Each seed runs ``rlcore train``'s default job for ``--steps`` steps twice, synchronously and with
``trainer.mode=stream trainer.rollout_chunk_tokens=2`` (the test's settings: answers are cut at a step's
end and finished in the next), and records the final greedy validation reward of each; both modes train
the same number of samples (``--steps`` batches of ``data.train_batch_size`` groups). Every run is
deterministic (the stream's schedule depends on seeds and token counts only), so the spread is the seeds'.

    python benchmarks/stream_learning_cpu.py --seeds 0 1 2 3 4 5 6 7 8 9 --out benchmarks/results/stream_learning_cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

MODES = {"sync": (), "stream": ("trainer.mode=stream", "trainer.rollout_chunk_tokens=2")}


def final_reward(out: Path, name: str, seed: int, steps: int, overrides: tuple[str, ...]) -> float:
    from rlcore.config import load_config
    from rlcore.trainer.loop import Trainer
    from rlcore.trainer.run import prepare_run

    config = load_config(
        overrides=[
            f"trainer.output_dir={out}",
            f"trainer.experiment_name={name}",
            "trainer.val_freq=0",
            "trainer.loggers=[jsonl]",
            "trainer.resume=disable",
            f"trainer.seed={seed}",
            f"trainer.total_steps={steps}",
            *overrides,
        ]
    )
    config, run_dir, text = prepare_run(config)
    trainer = Trainer(config, run_dir, config_yaml=text)
    try:
        history = trainer.fit()
    finally:
        trainer.close()
    return [r["val/reward"] for r in history if "val/reward" in r][-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results: dict[str, list[float]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for mode, overrides in MODES.items():
                reward = final_reward(Path(tmp), f"{mode}{seed}", seed, args.steps, overrides)
                results[mode].append(reward)
                print(f"seed {seed} {mode}: final val/reward {reward:.4f}", flush=True)
    diffs = [a - b for a, b in zip(results["stream"], results["sync"], strict=True)]
    summary = {
        "seeds": args.seeds,
        "steps": args.steps,
        "final_val_reward": results,
        "median": {mode: statistics.median(v) for mode, v in results.items()},
        "stream_minus_sync": {"per_seed": diffs, "median": statistics.median(diffs), "min": min(diffs)},
        # The test's statistic: the median of 3 seeds, for each window of 3 consecutive seeds.
        "median_of_3_gaps": [
            statistics.median(results["stream"][i : i + 3]) - statistics.median(results["sync"][i : i + 3])
            for i in range(0, len(args.seeds) - 2)
        ],
    }
    print(json.dumps(summary, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""A tiny learnable task for the trainer tests (loaded by path: test modules are not importable).

Prompts in verl's schema ask for nothing in particular; the reward is the fraction of the response's
characters that are digits, which the fake policy (a TinyLM over the tiny tokenizer's vocabulary) can
raise by putting mass on digit tokens. ``ground_truth`` switches the rule per prompt:

- ``"digits"``: the digit fraction (varies across a group's responses);
- ``"const"``: 0.5 whatever the response (a group DAPO's dynamic sampling must drop);
- ``"boom"``: the scorer raises (a bad sample the reward layer must name).
"""

from __future__ import annotations

import json
from pathlib import Path

from rlcore.config import load_config

REWARD_SOURCE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if ground_truth == "boom":
        raise ValueError("this scorer cannot score sample " + str(extra_info["index"]))
    if ground_truth == "const":
        return 0.5
    if not solution_str:
        return 0.0
    return sum(c.isdigit() for c in solution_str) / len(solution_str)
"""


def row(i: int, ground_truth: str = "digits", source: str = "test/digits") -> dict:
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": f"count {i} apples and {2 * i} pears"}],
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"index": i},
    }


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def write_task(root: Path, train_rows: list[dict] | None = None, val_rows: list[dict] | None = None) -> dict:
    """Write train/val files and the reward function under ``root``; return their paths."""
    root.mkdir(parents=True, exist_ok=True)
    train_rows = train_rows if train_rows is not None else [row(i) for i in range(32)]
    if val_rows is None:
        val_rows = [row(100 + i) for i in range(6)] + [row(200 + i, source="test/other") for i in range(2)]
    reward = root / "reward_fn.py"
    reward.write_text(REWARD_SOURCE)
    return {
        "train": write_jsonl(root / "train.jsonl", train_rows),
        "val": write_jsonl(root / "val.jsonl", val_rows),
        "reward": str(reward),
    }


def task_overrides(root: Path, files: dict, algorithm: str = "grpo", **extra: object) -> list[str]:
    """Overrides of a small fake-engine run on the task (``extra``: more ``key=value``, dots as ``__``)."""
    settings = {
        "engine": "fake",
        "rollout.engine": "fake",
        "algorithm.name": algorithm,
        "trainer.backend": "local",
        "trainer.total_steps": 4,
        "trainer.output_dir": str(root / "runs"),
        "trainer.experiment_name": "run",
        "trainer.loggers": "[jsonl]",
        "trainer.val_freq": 2,
        "data.train_files": f"[{files['train']}]",
        "data.val_files": f"[{files['val']}]",
        "data.train_batch_size": 4,
        "rollout.n": 4,
        "rollout.max_response_length": 8,
        "actor.optim.lr": 0.02,
        "critic.optim.lr": 0.02,
        "reward.custom_function_path": files["reward"],
        "reward.num_workers": 0,
    }
    settings.update({k.replace("__", "."): v for k, v in extra.items()})
    return [f"{k}={v}" for k, v in settings.items()]


def task_config(root: Path, files: dict, algorithm: str = "grpo", **extra: object):
    return load_config(None, task_overrides(root, files, algorithm, **extra))

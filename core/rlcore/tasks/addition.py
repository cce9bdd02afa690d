"""The built-in task ``addition``: "What is 7 + 12?" asked of a real pretrained model, rewarded when the
answer is right.

Every problem adds two whole numbers from 0 to 20 (441 problems), asked as one user chat message in the
form the model is used to. The reward is 1 when the last integer of the response is the sum and 0
otherwise (the lenient answer extraction of GSM8K-style rewards: ``"7 + 12 = 19"`` and ``"19"`` both
score), and a response cut at ``rollout.max_response_length`` before it states the sum scores 0.

Why this task: SmolLM2-135M-Instruct (``builtin:smollm2-135m-instruct``) knows these sums in part. Greedy
decoding gets about a third of them right, often after a long preamble; sampled at temperature 0.7 it
gets a given problem right in some of eight tries far more often than greedy decoding does, so GRPO
groups hold both right and wrong answers and there is something to learn in minutes on a CPU.

The split is fixed: :data:`VAL_SIZE` problems held out for validation (greedy, each once) and the rest
for training, so the validation reward is held-out accuracy.

>>> compute_score("rlcore/addition", "7 + 12 = 19", "19")
1.0
>>> compute_score("rlcore/addition", "The answer is 19. Or 20", "19")
0.0
"""

from __future__ import annotations

import random
import re
from typing import Any

#: The data source naming this task's reward function (``register_reward_functions``).
DATA_SOURCE = "rlcore/addition"
#: Each operand is drawn from ``0..MAX_OPERAND``.
MAX_OPERAND = 20
#: Problems held out for validation (of 441); the rest are the training problems.
VAL_SIZE = 200
#: The files this task provides (``builtin:addition/<split>.jsonl``).
SPLITS = ("train", "val")

_INTEGER = re.compile(r"-?\d+")


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **kwargs: Any
) -> float:
    """1.0 when the last integer in ``solution_str`` is ``ground_truth``, else 0.0."""
    found = _INTEGER.findall(solution_str)
    return 1.0 if found and found[-1] == str(ground_truth) else 0.0


def problems(split: str) -> list[tuple[int, int]]:
    """The ``(a, b)`` pairs of ``split``: all pairs shuffled once with a fixed seed, the first
    :data:`VAL_SIZE` held out."""
    if split not in SPLITS:
        raise ValueError(f"task 'addition' has no split {split!r}; its splits are {', '.join(SPLITS)}")
    pairs = [(a, b) for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)]
    random.Random(0).shuffle(pairs)
    return pairs[:VAL_SIZE] if split == "val" else pairs[VAL_SIZE:]


def rows(split: str) -> list[dict[str, Any]]:
    """Prompt rows in verl's schema (``prompt``, ``data_source``, ``reward_model.ground_truth``)."""
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": split, "index": index, "a": a, "b": b},
        }
        for index, (a, b) in enumerate(problems(split))
    ]


#: Settings under the user's when a run trains on this task (``data.train_files=[builtin:addition/train.jsonl]``).
RECIPE: dict[str, Any] = {
    "model": {"path": "builtin:smollm2-135m-instruct"},
    "algorithm": {"name": "grpo", "use_kl_loss": False},
    "actor": {"optim": {"lr": 1e-5}},
    "rollout": {"n": 8, "temperature": 0.7, "max_response_length": 16},
    "data": {"train_batch_size": 8, "max_prompt_length": 64},
    "reward": {"num_workers": 0},
    # 10 steps: in a 30-step trial held-out accuracy went 0.30 -> 0.69 by step 10, and 10 steps keep the
    # whole run (model build, start-up, three validations) near 12 minutes on two CPU cores.
    "trainer": {"total_steps": 10, "val_freq": 5},
}

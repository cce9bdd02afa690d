"""The built-in task ``tool_add``: add two four-digit numbers, which the tiny model cannot do, by calling
the calculator tool, which it can learn to do.

A prompt asks ``"Add the numbers:\\n4821 + 9033"``; an episode (:mod:`rlcore.agents`, ``agent.enabled``)
that calls ``calculator`` with the expression gets the sum back as a tool message, and the answer is right
when the final model turn is exactly the sum. Writing the call means copying the expression from the
prompt into ``<tool_call>{"name": "calculator", "arguments": {"expression": "4821 + 9033"}}</tool_call>``
and the answer means copying the tool's reply: the numbers start a line in both places, so the byte-level
tokenizer splits them the same way and the copies are token for token. Guessing cannot score: sums of
two random four-digit numbers rarely repeat.

Reward (:func:`compute_score`): 1 for the right answer; :data:`CALL_CREDIT` for an episode whose answer
is wrong but which called the calculator and got a result (a shaped format reward); 0 otherwise. From
random weights a model never writes a well-formed call, so the recipe also starts with a short supervised
warm-up on whole episodes (``sft`` split: the call, the tool's reply as the chat template renders it, the
answer) that leaves only some sampled episodes calling the tool; reinforcement learning then raises the
share of calls that run, and with it the reward (measured on the 2-core CPU box: 0.011 to 0.035-0.049
in 20 steps). Copying four-digit numbers exactly is hard for the 1.4M parameter model: no right answer in
those minutes (docs/quickstart.md shows the curve).

>>> compute_score("rlcore/tool_add", "...", "13854", {"agent": {"final_text": " 13854 "}})
1.0
>>> compute_score("rlcore/tool_add", "...", "13854", {"agent": {"final_text": "1385", "tool_calls": 1, "tool_errors": 0}})
0.1
>>> compute_score("rlcore/tool_add", "13854", "13854", {"agent": {"final_text": "<tool_call>..."}})
0.0
"""

from __future__ import annotations

import json
import random
from typing import Any

#: The data source naming this task's reward function (``register_reward_functions``).
DATA_SOURCE = "rlcore/tool_add"
#: The files this task provides (``builtin:tool_add/<split>.jsonl``).
SPLITS = ("train", "val", "sft")
#: Rows per split, and the seed of each split's numbers (the splits share no problem).
SIZES = {"train": 512, "val": 64, "sft": 512}
SEEDS = {"train": 1, "val": 2, "sft": 3}
DIGITS = 4
#: Reward of an episode that called the calculator without error but did not answer right.
CALL_CREDIT = 0.1


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **kwargs: Any
) -> float:
    """1.0 when the episode's final model turn (``extra_info["agent"]["final_text"]``, else the whole
    response) is exactly ``ground_truth`` after stripping white space; else :data:`CALL_CREDIT` when the
    episode made tool calls and none failed; else 0.0."""
    agent = (extra_info or {}).get("agent") or {}
    final = agent.get("final_text", solution_str)
    if str(final).strip() == str(ground_truth):
        return 1.0
    if agent.get("tool_calls", 0) > 0 and agent.get("tool_errors", 0) == 0:
        return CALL_CREDIT
    return 0.0


def problems(split: str) -> list[tuple[int, int]]:
    """The ``(a, b)`` pairs of ``split``, four-digit numbers drawn with the split's seed."""
    if split not in SPLITS:
        raise ValueError(f"task 'tool_add' has no split {split!r}; its splits are {', '.join(SPLITS)}")
    return draw_pairs(SEEDS[split], SIZES[split])


def draw_pairs(seed: int, count: int, digits: int = DIGITS) -> list[tuple[int, int]]:
    """``count`` pairs of ``digits``-digit numbers drawn with ``seed``."""
    rng = random.Random(seed)
    low, high = 10 ** (digits - 1), 10**digits
    return [(rng.randrange(low, high), rng.randrange(low, high)) for _ in range(count)]


def request(a: int, b: int) -> str:
    return f"Add the numbers:\n{a} + {b}"


def call(a: int, b: int, tool: str = "calculator") -> str:
    """The tool call that solves ``a + b`` with ``tool`` (Hermes format)."""
    if tool == "python":
        body = json.dumps({"name": "python", "arguments": {"code": f"print({a} + {b})"}})
    else:
        body = json.dumps({"name": "calculator", "arguments": {"expression": f"{a} + {b}"}})
    return f"<tool_call>{body}</tool_call>"


def episode_text(a: int, b: int, tool: str = "calculator") -> str:
    """A whole solving episode after the prompt, as the tiny model's chat template renders it: the call,
    its end of turn, the tool's reply (a program's output ends with a newline), the next turn's
    generation prompt, and the answer."""
    reply = f"{a + b}\n" if tool == "python" else f"{a + b}"
    return (
        f"{call(a, b, tool)}<|im_end|>\n<|im_start|>tool\n{reply}<|im_end|>\n<|im_start|>assistant\n{a + b}"
    )


def rows(split: str) -> list[dict[str, Any]]:
    """Prompt rows in verl's schema; ``sft`` rows add the whole episode as ``response``."""
    out = []
    for index, (a, b) in enumerate(problems(split)):
        row: dict[str, Any] = {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": request(a, b)}],
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": split, "index": index, "a": a, "b": b},
        }
        if split == "sft":
            row["response"] = episode_text(a, b)
        out.append(row)
    return out


#: Settings under the user's when a run trains on this task (``data.train_files=[builtin:tool_add/train.jsonl]``).
RECIPE: dict[str, Any] = {
    "model": {"path": "builtin:tiny"},
    # Both built-in tools are offered (and built in every rollout worker); the warm-up teaches the
    # calculator. Warm-up episodes that also call python (tool="python") slowed the rise in our runs.
    "agent": {
        "enabled": True,
        "tools": ["calculator", "python"],
        "max_turns": 2,
        "max_tool_response_tokens": 16,
    },
    "algorithm": {"name": "grpo", "use_kl_loss": False},
    "actor": {"optim": {"lr": 1e-3}, "micro_batch_size": 64},
    "rollout": {"n": 8, "temperature": 1.0, "max_response_length": 96},
    "data": {"train_batch_size": 16, "max_prompt_length": 32},
    "sft": {"batch_size": 32, "max_response_length": 96},
    "reward": {"num_workers": 0},
    "trainer": {"total_steps": 20, "warmup_sft_steps": 40, "val_freq": 5},
}

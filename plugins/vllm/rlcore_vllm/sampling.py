"""rlcore sampling settings and prompts, checked and translated into vLLM requests and back.

One rlcore request for ``n`` samples becomes ``n`` vLLM requests of one sample each (vLLM refuses
``n > 1`` when greedy), all sharing the prompt through vLLM's prefix cache.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from rlcore.api import Completion, SamplingParams

_FIELDS = tuple(f.name for f in attrs.fields(SamplingParams))


def sampling_params_from_dict(values: Mapping[str, Any], where: str = "sampling") -> SamplingParams:
    """Build :class:`~rlcore.api.SamplingParams` from a mapping (a config section, a request body).

    Unknown keys are an error that lists the valid ones; ``stop`` may be a string or a list.

    >>> sampling_params_from_dict({"n": 4, "temperature": 0.7, "stop": ["\\n\\n"]}).n
    4
    """
    unknown = sorted(set(values) - set(_FIELDS))
    if unknown:
        raise ValueError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; valid keys: {', '.join(_FIELDS)}"
        )
    kwargs = dict(values)
    stop = kwargs.get("stop")
    if isinstance(stop, str):
        kwargs["stop"] = (stop,)
    elif stop is not None:
        kwargs["stop"] = tuple(stop)
    return SamplingParams(**kwargs)


def check_sampling(params: SamplingParams) -> None:
    """Reject settings vLLM would refuse deep inside a request, with the key named."""
    if params.temperature < 0:
        raise ValueError(f"sampling.temperature must be >= 0 (0 is greedy), got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"sampling.top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < -1:
        raise ValueError(f"sampling.top_k must be -1 or 0 (off) or a positive count, got {params.top_k}")
    if any(not isinstance(s, str) or not s for s in params.stop):
        raise ValueError(f"sampling.stop must hold non-empty strings, got {params.stop!r}")


def check_prompts(
    prompts: Sequence[Sequence[int]], params: SamplingParams, *, vocab_size: int, max_model_len: int
) -> list[list[int]]:
    """Prompts as lists of ints; each must be non-empty, in the vocabulary, and leave room for
    ``params.max_tokens`` new tokens within ``max_model_len`` (vLLM would silently stop short)."""
    if isinstance(prompts, str | bytes) or (prompts and isinstance(prompts[0], int)):
        raise TypeError("generate takes a list of prompts, each a list of token ids; wrap a single prompt")
    checked = []
    for i, prompt in enumerate(prompts):
        ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError(f"vllm rollout: prompt {i} is empty; every prompt needs at least one token")
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise ValueError(
                f"vllm rollout: prompt {i} has token id {bad} outside the model's vocabulary [0, {vocab_size}); "
                f"was it tokenized with another tokenizer?"
            )
        if len(ids) + params.max_tokens > max_model_len:
            raise ValueError(
                f"vllm rollout: prompt {i} has {len(ids)} tokens, so sampling.max_tokens={params.max_tokens} "
                f"would run past rollout.max_model_len={max_model_len} (at most {max_model_len - len(ids)} "
                f"new tokens fit); lower max_tokens, shorten the prompt (data.max_prompt_length), or raise "
                f"max_model_len"
            )
        checked.append(ids)
    return checked


def request_seeds(params: SamplingParams, prompt_index: int) -> list[int | None]:
    """Seeds of the ``n`` samples of prompt ``prompt_index``: ``seed + prompt_index * n + j``, so that no
    two samples of a call share a random stream; ``None`` without a seed (vLLM's engine-seeded RNG)."""
    if params.seed is None:
        return [None] * params.n
    return [params.seed + prompt_index * params.n + j for j in range(params.n)]


def to_vllm(params: SamplingParams, seed: int | None):
    """One vLLM ``SamplingParams`` for a single sample of ``params``.

    Only the sampled token's log-prob is requested (``logprobs=0``); the checkpoint's generation config
    is not consulted, so a model's default top-k or repetition penalty never leaks in. Stop strings end
    the response with the token that completes them kept and the text cut before them (vLLM's default,
    the same convention as rlcore's reference HF rollout).
    """
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VLLMSamplingParams(
        n=1,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k > 0 else 0,
        max_tokens=params.max_tokens,
        stop=list(params.stop) or None,
        logprobs=0 if params.logprobs else None,
        seed=seed,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def to_completion(prompt: list[int], output: Any) -> Completion:
    """A :class:`~rlcore.api.Completion` from a finished vLLM ``RequestOutput`` of one sample."""
    sample = output.outputs[0]
    if sample.finish_reason not in ("stop", "length"):
        raise RuntimeError(
            f"vllm rollout: request {output.request_id} ended with finish_reason={sample.finish_reason!r} "
            f"(aborted by the engine?)"
        )
    token_ids = list(sample.token_ids)
    log_probs = None
    if sample.logprobs is not None:
        log_probs = [step[token].logprob for step, token in zip(sample.logprobs, token_ids, strict=True)]
    return Completion(
        prompt_ids=prompt,
        token_ids=token_ids,
        log_probs=log_probs,
        finish_reason=sample.finish_reason,
        text=sample.text,
    )

"""rlcore sampling settings and prompts, checked and translated into vLLM requests and back.

One rlcore request for ``n`` samples becomes ``n`` vLLM requests of one sample each (vLLM refuses
``n > 1`` when greedy), all sharing the prompt through vLLM's prefix cache.
"""

from __future__ import annotations

from collections.abc import Mapping
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

"""rlcore sampling settings and prompts, checked and translated into vLLM requests and back.

One rlcore request for ``n`` samples becomes ``n`` vLLM requests of one sample each (vLLM refuses
``n > 1`` when greedy), all sharing the prompt through vLLM's prefix cache.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from rlcore.api import Completion, SamplingParams
from rlcore.vision.inputs import BANNED_LOGIT

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


def to_vllm(params: SamplingParams, seed: int | None, banned: Sequence[int] = ()):
    """One vLLM ``SamplingParams`` for a single sample of ``params``.

    Only the sampled token's log-prob is requested (``logprobs=0``); the checkpoint's generation config
    is not consulted, so a model's default top-k or repetition penalty never leaks in. Stop strings end
    the response with the token that completes them kept and the text cut before them (vLLM's default,
    the same convention as rlcore's reference HF rollout).

    Why log-probs come back flat and undecoded: vLLM hands each sampled token's log-prob back as a dict
    holding a ``Logprob`` object whose token it decodes, per token and request, in the thread that also
    schedules the engine. At batch 256 on a 0.5B model that took generation from 37.2k to 14.6k tok/s on
    an H200 (``benchmarks/vllm_gap_gpu.py``, docs/benchmarks.md). ``flat_logprobs`` keeps them in a few
    plain lists per request, and the engine detokenizes only when stop strings need it; otherwise the
    plugin decodes each response's text once, at the end (:func:`to_completion`'s ``text``), as the
    reference HF rollout does.

    ``banned``: token ids whose logits get :data:`rlcore.vision.inputs.BANNED_LOGIT` (a vision model's image
    tokens), which ``processed_logprobs`` (the default ``vllm.logprobs_mode``) include, as the trainer's do.
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
        flat_logprobs=bool(params.logprobs),
        detokenize=engine_detokenizes(params),
        seed=seed,
        output_kind=RequestOutputKind.FINAL_ONLY,
        logit_bias={int(t): BANNED_LOGIT for t in banned} or None,
    )


def engine_detokenizes(params: SamplingParams) -> bool:
    """Whether vLLM decodes the text as it generates: only when stop strings need it."""
    return bool(params.stop)


def to_completion(prompt: list[int], output: Any, text: str | None = None) -> Completion:
    """A :class:`~rlcore.api.Completion` from a finished vLLM ``RequestOutput`` of one sample; ``text``:
    the response decoded by the caller where the engine did not detokenize (:func:`engine_detokenizes`)."""
    sample = output.outputs[0]
    if sample.finish_reason not in ("stop", "length"):
        raise RuntimeError(
            f"vllm rollout: request {output.request_id} ended with finish_reason={sample.finish_reason!r} "
            f"(aborted by the engine?)"
        )
    token_ids = list(sample.token_ids)
    return Completion(
        prompt_ids=prompt,
        token_ids=token_ids,
        log_probs=sampled_log_probs(sample.logprobs, token_ids),
        finish_reason=sample.finish_reason,
        text=sample.text if text is None else text,
    )


def sampled_log_probs(logprobs: Any, token_ids: list[int]) -> list[float] | None:
    """The sampled tokens' log-probs from vLLM's ``logprobs`` of one sample (None when not requested):
    ``FlatLogprobs`` (position ``i``'s entries start at ``start_indices[i]``, the sampled token first) or
    vLLM's list of one ``{token: Logprob}`` dict per position."""
    if logprobs is None:
        return None
    starts = getattr(logprobs, "start_indices", None)
    if starts is None:
        return [step[token].logprob for step, token in zip(logprobs, token_ids, strict=True)]
    if len(starts) != len(token_ids) or [logprobs.token_ids[s] for s in starts] != token_ids:
        raise RuntimeError("vllm rollout: the log-probs vLLM returned do not follow the sampled tokens")
    return [logprobs.logprobs[s] for s in starts]

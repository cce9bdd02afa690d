"""rlcore sampling settings and prompts, checked and translated into SGLang requests and back.

Pure Python (no sglang): SGLang takes sampling parameters as a plain dict and returns plain dicts.
One rlcore request for ``n`` samples becomes ``n`` SGLang requests of one sample each, so that each
sample has its own seed; they share the prompt's KV through SGLang's radix cache.

An SGLang result, as ``Engine.async_generate`` returns it for one request of a batch::

    {"text": "...", "output_ids": [17, 4, 2],
     "meta_info": {"id": "rlcore-...", "finish_reason": {"type": "stop", "matched": 2},
                   "output_token_logprobs": [(-0.7, 17, None), (-2.1, 4, None), (-0.01, 2, None)], ...}}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rlcore.api import Completion, SamplingParams
from rlcore.vision.inputs import BANNED_LOGIT


def to_sglang(params: SamplingParams, seed: int | None, banned: Sequence[int] = ()) -> dict[str, Any]:
    """SGLang's sampling-parameter dict for one sample of ``params``.

    Every field that changes the distribution is set explicitly, and the engine runs with
    ``sampling_defaults="openai"``, so a checkpoint's ``generation_config.json`` (top-k 20, repetition
    penalty ...) never leaks in. ``temperature=0`` is greedy (SGLang turns it into top-k 1). Stop strings
    end the response with the token that completes them kept in ``output_ids`` and the text cut before
    them, the convention of vLLM and rlcore's reference HF rollout.

    ``banned``: token ids whose logits get :data:`rlcore.vision.inputs.BANNED_LOGIT` (a vision model's image
    tokens). SGLang adds ``logit_bias`` before it samples and computes log-probs, as the trainer does.
    """
    out: dict[str, Any] = {
        "max_new_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "skip_special_tokens": True,
        "no_stop_trim": False,
    }
    if params.stop:
        out["stop"] = list(params.stop)
    if seed is not None:
        out["sampling_seed"] = seed
    if banned:
        out["logit_bias"] = {str(int(t)): BANNED_LOGIT for t in banned}
    return out


def to_completion(prompt: list[int], output: Mapping[str, Any], *, want_log_probs: bool) -> Completion:
    """A :class:`~rlcore.api.Completion` from one finished SGLang result (see the module docstring);
    ``prompt``: the prompt as the engine read it (with images, as its processor expanded them)."""
    meta = output["meta_info"]
    reason = meta.get("finish_reason") or {}
    kind = reason.get("type") if isinstance(reason, Mapping) else reason
    if kind not in ("stop", "length"):
        detail = reason.get("message") if isinstance(reason, Mapping) else None
        raise RuntimeError(
            f"sglang rollout: request {meta.get('id')} ended with finish_reason={reason!r}"
            + (f": {detail}" if detail else " (aborted by the engine?)")
        )
    token_ids = [int(t) for t in output["output_ids"]]
    log_probs = None
    if want_log_probs:
        entries = meta.get("output_token_logprobs")
        if entries is None or len(entries) != len(token_ids):
            got = "none" if entries is None else len(entries)
            raise RuntimeError(
                f"sglang rollout: request {meta.get('id')} returned {len(token_ids)} tokens but {got} "
                f"log-probs (was return_logprob set?)"
            )
        for step, (entry, token) in enumerate(zip(entries, token_ids, strict=True)):
            if int(entry[1]) != token:
                raise RuntimeError(
                    f"sglang rollout: request {meta.get('id')}: log-prob {step} is for token {entry[1]}, "
                    f"but the output has token {token} there"
                )
        log_probs = [float(entry[0]) for entry in entries]
    return Completion(
        prompt_ids=[int(t) for t in prompt],
        token_ids=token_ids,
        log_probs=log_probs,
        finish_reason=kind,
        text=output.get("text") or "",
    )

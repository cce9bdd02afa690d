"""The ``hf:`` config section: settings of the reference Hugging Face rollout (light to import)."""

from __future__ import annotations

from typing import Any

import attrs


def _positive(instance: Any, attribute: attrs.Attribute, value: int) -> None:
    if value < 1:
        raise ValueError(f"hf.{attribute.name} must be a positive integer, got {value!r}")


@attrs.define(kw_only=True)
class HFRolloutConfig:
    """Reference rollout on ``transformers`` models: slow, simple, and the yardstick for the others."""

    #: Sequences decoded together (a chunk of prompts times ``n``); bounds memory: ``batch_size x vocab``
    #: floats for the log-probs of one step, plus the KV cache of ``batch_size`` sequences.
    batch_size: int = attrs.field(default=64, validator=_positive)
    #: ``attn_implementation`` passed to ``from_pretrained`` (``"sdpa"``, ``"eager"``, ...); ``None``:
    #: the device platform's choice (``DevicePlatform.attention_implementation``; ``sdpa`` on CPU and CUDA).
    attn_implementation: str | None = None
    #: How tokens are produced. ``loop``: rlcore's own decode loop over the model's forward (one prefill per
    #: distinct prompt of a chunk, then one token per step into a KV cache allocated once for the prompt
    #: plus ``max_tokens``, inverse-CDF sampling from a per-call ``torch.Generator``; about 0.6x the time of
    #: ``generate`` for the tiny model on CPU, ``benchmarks/hf_decode.py``). ``generate``: ``model.generate``
    #: with a log-prob recording processor. Both sample the same distribution and record the same
    #: log-probs; one seed gives different samples in the two (greedy gives the same tokens).
    decode: str = attrs.field(default="loop", validator=attrs.validators.in_(("loop", "generate")))

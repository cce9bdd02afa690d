"""The ``hf:`` config section: settings of the reference Hugging Face rollout (light to import)."""

from __future__ import annotations

from typing import Any

import attrs


def _positive(instance: Any, attribute: attrs.Attribute, value: int) -> None:
    if value < 1:
        raise ValueError(f"hf.{attribute.name} must be a positive integer, got {value!r}")


@attrs.define(kw_only=True)
class HFRolloutConfig:
    """Reference rollout on ``transformers`` ``generate``: slow, simple, and the yardstick for the others."""

    #: Sequences per ``generate`` call (prompts times ``n``); bounds memory: ``batch_size x vocab`` floats
    #: for the log-probs of one step, plus the KV cache of ``batch_size`` sequences.
    batch_size: int = attrs.field(default=64, validator=_positive)
    #: ``attn_implementation`` passed to ``from_pretrained`` (``"sdpa"``, ``"eager"``, ...); ``None``:
    #: the device platform's choice (``DevicePlatform.attention_implementation``; ``sdpa`` on CPU and CUDA).
    attn_implementation: str | None = None

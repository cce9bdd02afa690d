"""Config sections of the fake engines (``fake:`` for both roles). Light to import: no torch.

The fake train engine and the fake rollout build the same :class:`~rlcore.testing.tiny_lm.TinyLM`; give
both the same model fields (and the same seed in their specs) and they start from identical weights.
"""

from __future__ import annotations

import attrs


def _non_negative(instance, attribute: attrs.Attribute, value: float) -> None:
    if value < 0:
        raise ValueError(f"fake.{attribute.name} must be >= 0, got {value}")


def _positive_or_none(instance, attribute: attrs.Attribute, value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"fake.{attribute.name} must be >= 1 (or null), got {value}")


@attrs.define
class TinyLMConfig:
    """Shape of the tiny language model shared by the fake engines."""

    #: Vocabulary size. None: ``vocab_size`` from ``<model_path>/config.json`` when that file exists
    #: (so token ids of a real tokenizer fit), else 256.
    vocab_size: int | None = attrs.field(default=None, validator=_positive_or_none)
    #: Width of the embedding and of the residual stream.
    hidden_size: int = attrs.field(default=32, validator=_positive_or_none)
    #: Let each position also see the previous token (a bigram-conditioned model); False: unigram context.
    prev_token: bool = True


@attrs.define
class FakeTrainConfig(TinyLMConfig):
    """The ``fake:`` section of a train role."""

    #: Seconds added to every ``train_step`` call (sleep), to model a fixed-cost engine in benchmarks.
    step_cost_s: float = attrs.field(default=0.0, validator=_non_negative)
    #: Seconds added to every ``infer`` call (sleep).
    infer_cost_s: float = attrs.field(default=0.0, validator=_non_negative)


@attrs.define
class FakeRolloutConfig(TinyLMConfig):
    """The ``fake:`` section of the rollout."""

    #: Generation stops after this token (it is kept in ``token_ids``). None: ``eos_token_id`` from
    #: ``<model_path>/config.json`` when that file exists, else no end-of-sequence token.
    eos_token_id: int | None = None
    #: More token ids that end a completion, like the eos token.
    stop_token_ids: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    #: Seconds added to every ``generate`` call and to every ``agenerate`` request (sleep).
    generate_cost_s: float = attrs.field(default=0.0, validator=_non_negative)

"""The ``reward:`` section of the config: which provider scores responses and how."""

from __future__ import annotations

from typing import Any

import attrs

ON_ERROR_MODES = ("raise", "zero")


def _non_negative(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    if value < 0:
        raise ValueError(f"reward.{attribute.name} must be >= 0, got {value!r}")


def _positive(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    if not value > 0:
        raise ValueError(f"reward.{attribute.name} must be > 0, got {value!r}")


def _on_error(instance: Any, attribute: attrs.Attribute, value: str) -> None:
    if value not in ON_ERROR_MODES:
        raise ValueError(f"reward.on_error must be one of {', '.join(ON_ERROR_MODES)}; got {value!r}")


@attrs.define(kw_only=True)
class RewardConfig:
    """How responses are scored. The ``rule`` provider looks a scorer up by each sample's ``data_source``
    (``openai/gsm8k``, ``lighteval/MATH`` ... or any a plugin registers), or calls a user function for all."""

    #: Reward provider, by registered name (``rule``: rule functions; plugins may add others).
    provider: str = "rule"
    #: Python file holding a user scoring function (verl's ``custom_reward_function.path``). When set it
    #: scores every sample, whatever its data source.
    custom_function_path: str | None = None
    #: Name of that function; called as ``fn(data_source=, solution_str=, ground_truth=, extra_info=, **kwargs)``
    #: and returning a number or a dict with a ``score`` key.
    custom_function_name: str = "compute_score"
    #: Extra keyword arguments for the user function (verl's ``custom_reward_function.reward_kwargs``).
    custom_function_kwargs: dict[str, Any] = attrs.field(factory=dict)
    #: Worker processes that run the scorers; 0 scores in the calling process (for debugging).
    num_workers: int = attrs.field(default=2, validator=_non_negative)
    #: Seconds one sample may take to score before it counts as failed.
    timeout_s: float = attrs.field(default=10.0, validator=_positive)
    #: A scorer that raises, times out or returns a non-number: ``raise`` fails the step with a
    #: ``RewardError`` naming the sample; ``zero`` scores it 0 and counts it in ``reward/errors``.
    on_error: str = attrs.field(default="raise", validator=_on_error)

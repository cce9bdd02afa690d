"""Rewards: verl-style rule scorers, user functions from a file, the ``rule`` reward provider, and the
reward-model provider (the ``reward_model:`` section).

Importing this package is light (no torch); :class:`RuleRewardProvider` and :class:`ModelRewardProvider`
are imported on first use.

>>> from rlcore.rewards import default_compute_score
>>> default_compute_score("openai/gsm8k", "so the answer is #### 42", "42")
1.0
"""

from typing import Any

from rlcore.rewards.config import ON_ERROR_MODES, RewardConfig
from rlcore.rewards.errors import RewardError
from rlcore.rewards.functions import (
    default_compute_score,
    known_data_sources,
    load_reward_function,
    reward_function_for,
)
from rlcore.rewards.model_config import RewardModelConfig

__all__ = [
    "ON_ERROR_MODES",
    "RewardConfig",
    "ModelRewardProvider",
    "RewardError",
    "RewardModelConfig",
    "RuleRewardProvider",
    "default_compute_score",
    "known_data_sources",
    "load_reward_function",
    "reward_function_for",
]


def __getattr__(name: str) -> Any:
    if name == "RuleRewardProvider":
        from rlcore.rewards.rule_provider import RuleRewardProvider

        return RuleRewardProvider
    if name == "ModelRewardProvider":
        from rlcore.rewards.model_provider import ModelRewardProvider

        return ModelRewardProvider
    raise AttributeError(f"module 'rlcore.rewards' has no attribute {name!r}")

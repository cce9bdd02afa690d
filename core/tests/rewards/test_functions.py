"""Finding scorers: the registry (built-in plugin), and user functions loaded from a file."""

from __future__ import annotations

import pytest
from rlcore.plugins import registry
from rlcore.rewards import (
    RewardConfig,
    RewardError,
    default_compute_score,
    gsm8k,
    known_data_sources,
    load_reward_function,
    math_reward,
    reward_function_for,
)
from rlcore.rewards.rule_provider import RuleRewardProvider


def test_builtin_plugin_registers_scorers_and_provider():
    sources = known_data_sources()
    for source in (
        "openai/gsm8k",
        "lighteval/MATH",
        "DigitalLearningGmbH/MATH-lighteval",
        "HuggingFaceH4/MATH-500",
    ):
        assert source in sources
    assert reward_function_for("openai/gsm8k") is gsm8k.compute_score
    assert reward_function_for("DigitalLearningGmbH/MATH-lighteval") is math_reward.compute_score
    entry = registry("reward_providers").entry("rule")
    assert entry.plugin == "rlcore.builtin.rewards"
    assert entry.load() is RuleRewardProvider
    assert entry.options["config"] is RewardConfig


def test_unknown_data_source_lists_known_ones():
    with pytest.raises(RewardError) as info:
        reward_function_for("my/dataset")
    message = str(info.value)
    assert "no reward function for data source 'my/dataset'" in message
    assert "openai/gsm8k" in message and "lighteval/MATH" in message
    assert "reward.custom_function_path" in message


def test_default_compute_score_dispatches_by_data_source():
    assert default_compute_score("openai/gsm8k", "#### 3", "3") == 1.0
    assert default_compute_score("lighteval/MATH", "#### 3", "3") == 0.0  # MATH wants a boxed answer
    assert default_compute_score("lighteval/MATH", "\\boxed{3}", "3") == 1.0


def test_load_user_function(user_file):
    path = user_file(
        """
        import dataclasses

        @dataclasses.dataclass
        class Weights:
            right: float = 2.0

        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return Weights().right if solution_str == ground_truth else 0.0

        def other(data_source, solution_str, ground_truth, extra_info=None):
            return -1.0
        """
    )
    fn = load_reward_function(path)
    assert fn(data_source="x", solution_str="a", ground_truth="a") == 2.0
    assert load_reward_function(path, "other")("x", "a", "a") == -1.0
    assert load_reward_function(path) is fn  # loaded once per process


def test_missing_file(tmp_path):
    with pytest.raises(RewardError, match=r"nope\.py' does not exist \(reward\.custom_function_path\)"):
        load_reward_function(tmp_path / "nope.py")


def test_file_that_does_not_import_shows_the_exception(user_file):
    path = user_file(
        """
        import math

        TABLE = {"a": 1}
        LOOKUP = TABLE["b"]
        """
    )
    with pytest.raises(RewardError) as info:
        load_reward_function(path)
    message = str(info.value)
    assert "failed to import" in message
    assert "Traceback" in message and "KeyError: 'b'" in message
    assert 'LOOKUP = TABLE["b"]' in message


def test_syntax_error_is_reported(user_file):
    path = user_file("def compute_score(:\n    pass\n")
    with pytest.raises(RewardError, match=r"failed to import:(.|\n)*SyntaxError"):
        load_reward_function(path)


def test_missing_function_lists_defined_callables(user_file):
    path = user_file(
        """
        from os.path import join

        THRESHOLD = 0.5

        def score_answer(data_source, solution_str, ground_truth, extra_info=None):
            return 1.0

        class Scorer:
            pass

        def _helper():
            pass
        """
    )
    with pytest.raises(
        RewardError,
        match=r"has no attribute 'compute_score' \(reward\.custom_function_name\)\. "
        r"Callables it defines: Scorer, score_answer\.",
    ):
        load_reward_function(path)
    with pytest.raises(RewardError, match=r"has a non-callable float 'THRESHOLD'"):
        load_reward_function(path, "THRESHOLD")


def test_scorers_travel_to_workers_by_reference():
    from rlcore.rewards.worker import reference

    assert reference(gsm8k.compute_score) == "rlcore.rewards.gsm8k:compute_score"
    assert reference(math_reward.compute_score) == "rlcore.rewards.math_reward:compute_score"
    assert reference(lambda **kw: 1.0) is None  # resolved through the worker's own registry instead

    def local(**kw):
        return 1.0

    assert reference(local) is None

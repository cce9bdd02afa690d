"""RuleRewardProvider scoring in the calling process (num_workers=0): placement, errors, timeouts."""

from __future__ import annotations

import pytest
import torch
from rlcore.rewards import RewardConfig, RewardError
from rlcore.rewards.rule_provider import RuleRewardProvider

SAMPLES = [
    ("openai/gsm8k", "so #### 72", "72"),
    ("openai/gsm8k", "so #### 71", "72"),
    ("lighteval/MATH", "thus $\\boxed{\\frac{1}{2}}$", "0.5"),
    ("HuggingFaceH4/MATH-500", "I think 3", "3"),
    ("openai/gsm8k", "#### 5", "5"),
]
# Scores worked out by hand from the rules: strict gsm8k, boxed MATH.
EXPECTED = [1.0, 0.0, 1.0, 0.0, 1.0]
LENGTHS = [3, 8, 1, 5, 0]  # the last row has no valid token: its score has nowhere to go


def expected_tensor(scores, lengths, width=8):
    out = torch.zeros(len(scores), width, dtype=torch.float32)
    for i, (s, n) in enumerate(zip(scores, lengths, strict=True)):
        if n > 0:
            out[i, n - 1] = s
    return out


def inline(**config):
    return RuleRewardProvider(RewardConfig(num_workers=0, **config))


def test_scores_by_data_source_on_the_last_valid_token(batch_of):
    out = inline().score(batch_of(SAMPLES, LENGTHS))
    scores = out["token_level_scores"]
    assert scores.dtype == torch.float32
    assert torch.equal(scores, expected_tensor(EXPECTED, LENGTHS))
    assert out["reward_extra_info"] == [{}] * 5
    assert out.meta["metrics"] == {"reward/errors": 0.0, "reward/timeouts": 0.0}


def test_unknown_data_source_fails_before_scoring(batch_of):
    batch = batch_of([("openai/gsm8k", "#### 1", "1"), ("my/dataset", "x", "y")], [2, 2])
    with pytest.raises(
        RewardError, match=r"no reward function for data source 'my/dataset'\. Known data sources:"
    ):
        inline().score(batch)


def test_custom_function_scores_every_sample_with_kwargs_and_extra_info(batch_of, user_file):
    path = user_file(
        """
        def reward(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
            right = solution_str.strip().endswith(str(ground_truth))
            return {"score": float(right) + bonus, "row": extra_info["row"], "source": data_source}
        """
    )
    config = dict(
        custom_function_path=path, custom_function_name="reward", custom_function_kwargs={"bonus": 0.5}
    )
    batch = batch_of([("any/thing", "it is 4", "4"), ("my/dataset", "it is 5", "4")], [2, 4])
    out = inline(**config).score(batch)
    assert torch.equal(out["token_level_scores"], expected_tensor([1.5, 0.5], [2, 4]))
    assert out["reward_extra_info"] == [{"row": 0, "source": "any/thing"}, {"row": 1, "source": "my/dataset"}]


RAISING = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if "boom" in solution_str:
        return 1 / 0
    return 1.0
"""


def test_raising_user_function_fails_the_step_naming_the_sample(batch_of, user_file):
    path = user_file(RAISING)
    batch = batch_of([("a", "fine", "x"), ("b", "then boom goes the scorer", "x")], [2, 3])
    with pytest.raises(RewardError) as info:
        inline(custom_function_path=path).score(batch)
    message = str(info.value)
    assert "reward scoring failed on 1 of 2 samples" in message
    assert (
        "batch row 1 (dataset index 101), data_source 'b', response starts 'then boom goes the scorer'"
        in message
    )
    assert f"{path}:compute_score" in message
    assert "Traceback" in message and "ZeroDivisionError: division by zero" in message
    assert "return 1 / 0" in message
    assert "reward.on_error=zero" in message


def test_raising_user_function_with_on_error_zero_counts(batch_of, user_file, caplog):
    path = user_file(RAISING)
    batch = batch_of([("a", "fine", "x"), ("b", "boom", "x"), ("c", "boom", "x")], [2, 3, 1])
    out = inline(custom_function_path=path, on_error="zero").score(batch)
    assert torch.equal(out["token_level_scores"], expected_tensor([1.0, 0.0, 0.0], [2, 3, 1]))
    assert out.meta["metrics"] == {"reward/errors": 2.0, "reward/timeouts": 0.0}
    assert "reward scored 0 for batch row 1" in caplog.text
    assert "ZeroDivisionError" in caplog.text


@pytest.mark.parametrize(
    "body, detail",
    [
        ("return None", r"returned NoneType None; it must return a number or a dict with a numeric 'score'"),
        ("return float('nan')", r"returned the non-finite score nan"),
        ("return {'acc': 1.0}", r"returned a dict without a 'score' key \(keys: \['acc'\]\)"),
        ("return '1.0'", r"returned str '1\.0'"),
    ],
)
def test_bad_return_values_are_errors(batch_of, user_file, body, detail):
    path = user_file(
        f"def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    {body}\n"
    )
    batch = batch_of([("a", "text", "x")], [1])
    with pytest.raises(RewardError, match=detail):
        inline(custom_function_path=path).score(batch)


def test_verl_style_tuple_and_bool_results(batch_of, user_file):
    path = user_file(
        """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return (0.25, {"tests": 4}) if solution_str == "tuple" else solution_str == ground_truth
        """
    )
    out = inline(custom_function_path=path).score(batch_of([("a", "tuple", "x"), ("a", "x", "x")], [1, 1]))
    assert out["token_level_scores"][:, 0].tolist() == [0.25, 1.0]


SLOW = """
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "slow":
        try:
            time.sleep(30)
        except Exception:  # a scorer that swallows exceptions still cannot swallow the timeout
            pass
    return 1.0
"""


def test_timeout_raises(batch_of, user_file):
    batch = batch_of([("a", "fast", "x"), ("a", "slow", "x")], [1, 1])
    with pytest.raises(RewardError, match=r"batch row 1 .* timed out after reward\.timeout_s=0\.3 s"):
        inline(custom_function_path=user_file(SLOW), timeout_s=0.3).score(batch)


def test_timeout_with_on_error_zero_counts(batch_of, user_file):
    batch = batch_of([("a", "slow", "x"), ("a", "fast", "x")], [1, 1])
    out = inline(custom_function_path=user_file(SLOW), timeout_s=0.3, on_error="zero").score(batch)
    assert out["token_level_scores"][:, 0].tolist() == [0.0, 1.0]
    assert out.meta["metrics"] == {"reward/errors": 1.0, "reward/timeouts": 1.0}


def test_bad_custom_function_fails_at_construction(user_file):
    path = user_file("def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    with pytest.raises(RewardError, match=r"has no attribute 'compute_score'.*Callables it defines: score\."):
        RuleRewardProvider(RewardConfig(custom_function_path=path))


def test_config_validation():
    with pytest.raises(ValueError, match=r"reward\.on_error must be one of raise, zero; got 'ignore'"):
        RewardConfig(on_error="ignore")
    with pytest.raises(ValueError, match=r"reward\.timeout_s must be > 0, got 0"):
        RewardConfig(timeout_s=0)
    with pytest.raises(ValueError, match=r"reward\.num_workers must be >= 0, got -1"):
        RewardConfig(num_workers=-1)


def test_batch_without_extra_info_and_empty_batch(batch_of):
    batch = batch_of([("openai/gsm8k", "#### 2", "2")], [4])
    del batch.objects["extra_info"]
    assert inline().score(batch)["token_level_scores"][0].tolist() == [0, 0, 0, 1.0, 0, 0, 0, 0]
    empty = inline().score(batch.index([]))
    assert empty["token_level_scores"].shape == (0, 8)


def flaky_scorer(data_source, solution_str, ground_truth, extra_info=None):
    raise KeyError("no field 'answer'")


def test_failure_in_a_registered_scorer_names_it(batch_of):
    from rlcore.plugins import registry, reset_plugins

    registry("reward_functions").register("test/flaky", flaky_scorer, plugin="test-plugin")
    try:
        with pytest.raises(RewardError) as info:
            inline().score(batch_of([("test/flaky", "answer", "1")], [2]))
    finally:
        reset_plugins()  # the next lookup reloads plugins, without the test's entry
    message = str(info.value)
    assert "flaky_scorer" in message and "(plugin test-plugin)" in message
    assert "KeyError: \"no field 'answer'\"" in message

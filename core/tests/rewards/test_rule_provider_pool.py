"""RuleRewardProvider with worker processes: same scores as inline, errors and timeouts cross the process
boundary, and a stuck or crashed worker is killed and replaced instead of hanging the step."""

from __future__ import annotations

import os

import pytest
import torch
from rlcore.rewards import RewardConfig, RewardError
from rlcore.rewards.rule_provider import RuleRewardProvider

PID_REPORTING = """
import os
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "boom":
        raise ValueError("bad sample " + str(extra_info["row"]))
    if solution_str == "slow":
        time.sleep(30)
    return {"score": float(solution_str == ground_truth), "pid": os.getpid()}
"""


@pytest.fixture
def provider(request, user_file):
    """A two-worker provider for the user function above; ``on_error`` from the test's param if any."""
    on_error = getattr(request, "param", "raise")
    config = RewardConfig(
        num_workers=2, timeout_s=0.5, on_error=on_error, custom_function_path=user_file(PID_REPORTING)
    )
    p = RuleRewardProvider(config, backstop_grace_s=2.0)
    yield p
    p.close()


def test_builtin_scorers_give_the_inline_scores(batch_of):
    samples = [("openai/gsm8k", f"#### {i % 7}", str(i % 5)) for i in range(24)]
    samples += [("lighteval/MATH", f"\\boxed{{{i}}}", str(i % 2)) for i in range(8)]
    lengths = [1 + i % 8 for i in range(len(samples))]
    batch = batch_of(samples, lengths)
    # Reference: the rules applied sample by sample in this process.
    expected = torch.zeros(len(samples), 8)
    for i, (source, text, truth) in enumerate(samples):
        if source == "openai/gsm8k":
            right = text.removeprefix("#### ") == truth
        else:
            right = text[len("\\boxed{") : -1] == truth
        expected[i, lengths[i] - 1] = float(right)
    pooled = RuleRewardProvider(RewardConfig(num_workers=2))
    try:
        out = pooled.score(batch)
    finally:
        pooled.close()
    assert torch.equal(out["token_level_scores"], expected)
    assert torch.equal(
        RuleRewardProvider(RewardConfig(num_workers=0)).score(batch)["token_level_scores"], expected
    )


def test_scoring_runs_in_reused_worker_processes(provider, batch_of):
    batch = batch_of([("a", "4", "4"), ("a", "5", "4")] * 4, [2] * 8)
    first = provider.score(batch)
    assert first["token_level_scores"][:, 1].tolist() == [1.0, 0.0] * 4
    pids = {info["pid"] for info in first["reward_extra_info"]}
    assert os.getpid() not in pids
    second = provider.score(batch)
    pids |= {info["pid"] for info in second["reward_extra_info"]}
    assert len(pids) <= 2  # both steps ran in the same two workers


def test_exception_in_worker_reports_sample_and_traceback(provider, batch_of):
    batch = batch_of([("a", "4", "4"), ("src/x", "boom", "4"), ("a", "4", "4")], [1, 1, 1])
    with pytest.raises(RewardError) as info:
        provider.score(batch)
    message = str(info.value)
    assert "batch row 1 (dataset index 101), data_source 'src/x', response starts 'boom'" in message
    assert "ValueError: bad sample 1" in message
    assert 'raise ValueError("bad sample " + str(extra_info["row"]))' in message


@pytest.mark.parametrize("provider", ["zero"], indirect=True)
def test_exception_and_timeout_in_worker_with_on_error_zero(provider, batch_of):
    batch = batch_of(
        [("a", "4", "4"), ("a", "boom", "4"), ("a", "slow", "slow"), ("a", "4", "4")], [1, 1, 1, 1]
    )
    out = provider.score(batch)
    assert out["token_level_scores"][:, 0].tolist() == [1.0, 0.0, 0.0, 1.0]
    assert out.meta["metrics"] == {"reward/errors": 2.0, "reward/timeouts": 1.0}


def test_timeout_in_worker_raises(provider, batch_of):
    batch = batch_of([("a", "slow", "x")], [1])
    with pytest.raises(RewardError, match=r"batch row 0 .* timed out after reward\.timeout_s=0\.5 s"):
        provider.score(batch)


def test_worker_that_ignores_the_timer_is_killed_and_replaced(user_file, batch_of):
    # Blocking SIGALRM stands in for a scorer stuck in native code, where the timer cannot reach it.
    path = user_file(
        """
        import signal
        import time

        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            if solution_str == "stuck":
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
                time.sleep(60)
            return 1.0
        """
    )
    provider = RuleRewardProvider(
        RewardConfig(num_workers=1, timeout_s=0.2, custom_function_path=path), backstop_grace_s=1.0
    )
    try:
        with pytest.raises(
            RewardError, match=r"did not return within \d+ s .* the worker processes were killed"
        ):
            provider.score(batch_of([("a", "stuck", "x")], [1]))
        # The next step gets a fresh pool.
        out = provider.score(batch_of([("a", "fine", "x")], [1]))
        assert out["token_level_scores"].tolist() == [[1.0] + [0.0] * 7]
    finally:
        provider.close()


def test_worker_that_dies_is_reported_and_replaced(user_file, batch_of):
    path = user_file(
        """
        import os

        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            if solution_str == "exit":
                os._exit(3)
            return 1.0
        """
    )
    provider = RuleRewardProvider(RewardConfig(num_workers=1, custom_function_path=path))
    try:
        with pytest.raises(RewardError, match=r"the reward worker process died while scoring"):
            provider.score(batch_of([("a", "exit", "x")], [1]))
        assert provider.score(batch_of([("a", "fine", "x")], [1]))["token_level_scores"][0, 0] == 1.0
    finally:
        provider.close()

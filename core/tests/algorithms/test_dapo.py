"""DAPO pieces: group filtering, the dynamic-sampling accumulator, overlong reward shaping."""

import logging

import pytest
import torch
from rlcore.algorithms import (
    DynamicSampler,
    DynamicSamplingExhausted,
    apply_overlong_penalty,
    filter_groups,
    group_metric,
    overlong_penalty,
)
from rlcore.api import Batch


def gen_batch(groups, start=0, n=2):
    """A generation batch: ``groups`` is a list of per-group score lists; uids ``g{start + k}``."""
    uids, scores = [], []
    for k, vals in enumerate(groups):
        assert len(vals) == n
        uids += [f"g{start + k}"] * n
        scores += vals
    tls = torch.zeros(len(scores), 3)
    tls[:, -1] = torch.tensor(scores, dtype=torch.float32)
    return Batch(
        {"token_level_scores": tls, "response_mask": torch.ones(len(scores), 3)},
        {"uid": uids, "reward_extra_info": [{"acc": float(s > 0)} for s in scores]},
    )


def test_filter_groups_hand_worked():
    keep = filter_groups(["a", "a", "b", "b", "c"], [1.0, 0.0, 1.0, 1.0, 0.0])
    assert keep.tolist() == [True, True, False, False, True]  # a varies, b is constant, c is alone


def test_filter_groups_exact_equality_despite_float_noise():
    # The mean of three 0.1s is not 0.1 in floating point; equality must still be detected.
    assert filter_groups([7, 7, 7], [0.1, 0.1, 0.1]).tolist() == [False, False, False]
    assert filter_groups(torch.tensor([1, 1]), torch.tensor([0.5, 0.5000001])).tolist() == [True, True]


def test_group_metric_sources():
    batch = gen_batch([[1.0, 0.0], [0.5, 0.5]])
    assert group_metric(batch, "seq_reward") == [1.0, 0.0, 0.5, 0.5]
    assert group_metric(batch, "acc") == [1.0, 0.0, 1.0, 1.0]
    with pytest.raises(KeyError, match="token_level_rewards"):
        group_metric(batch, "seq_final_reward")
    with pytest.raises(KeyError, match="'score'"):
        group_metric(batch, "score")


def test_sampler_collects_across_generation_batches():
    sampler = DynamicSampler(num_groups=3, max_num_gen_batches=5)
    first = gen_batch([[1, 0], [1, 1], [0, 0]], start=0)
    assert not sampler.add(first, group_metric(first, "acc"))
    assert sampler.num_kept_groups == 1
    second = gen_batch([[0, 0], [0, 1], [1, 0], [1, 0]], start=10)
    assert sampler.add(second, group_metric(second, "acc"))
    assert sampler.metrics()["dynamic_sampling/kept_group_fraction"] == pytest.approx(4 / 7)
    batch = sampler.take()
    # The first three kept groups, every response of each, in arrival order; the fourth is dropped.
    assert batch["uid"] == ["g0", "g0", "g11", "g11", "g12", "g12"]
    assert batch["token_level_scores"][:, -1].tolist() == [1, 0, 0, 1, 1, 0]
    assert batch.meta["dynamic_sampling/num_gen_batches"] == 2
    # take() resets: the next training batch starts from nothing.
    assert sampler.num_gen_batches == 0 and sampler.num_kept_groups == 0
    with pytest.raises(RuntimeError, match="add more batches"):
        sampler.take()


def test_sampler_exhaustion_raises_with_advice():
    sampler = DynamicSampler(num_groups=2, max_num_gen_batches=2)
    sampler.add(gen_batch([[1, 1]]), [1, 1])
    with pytest.raises(DynamicSamplingExhausted, match=r"kept 0 of the 2 groups.*max_num_gen_batches=2"):
        sampler.add(gen_batch([[0, 0]], start=1), [0, 0])


def test_sampler_partial_mode_warns_and_returns_what_it_has(caplog):
    sampler = DynamicSampler(num_groups=3, max_num_gen_batches=2, on_exhausted="partial")
    sampler.add(gen_batch([[1, 0]]), [1, 0])
    with caplog.at_level(logging.WARNING, logger="rlcore.algorithms.dapo"):
        assert sampler.add(gen_batch([[0, 0]], start=1), [0, 0])
    assert "kept 1 of the 3 groups" in caplog.text
    assert sampler.take()["uid"] == ["g0", "g0"]
    with pytest.raises(RuntimeError, match="full"):
        full = DynamicSampler(num_groups=1)
        full.add(gen_batch([[1, 0]]), [1, 0])
        full.add(gen_batch([[1, 0]], start=1), [1, 0])


def test_sampler_without_limit_keeps_drawing():
    sampler = DynamicSampler(num_groups=1, max_num_gen_batches=0)
    for k in range(25):
        assert not sampler.add(gen_batch([[1, 1]], start=k), [1, 1])
    assert sampler.add(gen_batch([[1, 0]], start=99), [1, 0])
    assert sampler.take()["uid"] == ["g99", "g99"]


def test_sampler_needs_uids():
    sampler = DynamicSampler(num_groups=1)
    with pytest.raises(KeyError, match="'uid'"):
        sampler.add(Batch({"token_level_scores": torch.zeros(2, 3)}), [0, 1])
    with pytest.raises(ValueError, match="num_groups"):
        DynamicSampler(num_groups=0)


def test_overlong_penalty_hand_worked():
    lengths = [10, 16, 17, 18, 20]
    # max 20, buffer 4: free up to 16 tokens, then -1/4 per token.
    assert overlong_penalty(lengths, 20, 4).tolist() == [0.0, 0.0, -0.25, -0.5, -1.0]
    assert overlong_penalty(lengths, 20, 4, penalty_factor=0.5).tolist() == [0.0, 0.0, -0.125, -0.25, -0.5]
    with pytest.raises(ValueError, match="buffer_len"):
        overlong_penalty(lengths, 3, 4)
    with pytest.raises(ValueError, match="buffer_len must be > 0"):
        overlong_penalty(lengths, 20, 0)


def test_apply_overlong_penalty_on_last_valid_token():
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0]])
    scores = torch.zeros(3, 6)
    scores[0, 5], scores[1, 4] = 1.0, 1.0
    out, penalty = apply_overlong_penalty(scores, mask, max_response_length=6, buffer_len=4)
    # Row 0: 6 tokens, 4 over the 2 free -> -1. Row 1 (multi-turn, 3 valid tokens) -> -0.25 at index 4.
    assert penalty.tolist() == [-1.0, -0.25, 0.0]
    expected = torch.zeros(3, 6)
    expected[0, 5], expected[1, 4] = 0.0, 0.75
    assert torch.equal(out, expected)
    assert scores[0, 5] == 1.0  # the input is not modified

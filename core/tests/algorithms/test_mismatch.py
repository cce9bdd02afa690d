"""The mismatch metrics (:mod:`rlcore.algorithms.mismatch`) against a float64 computation written here
token by token from the definitions (probabilities, perplexities, sorted lists), on ragged masked rows
whose padding holds values that would spoil every statistic if they counted."""

from __future__ import annotations

import doctest
import math
import random

import pytest
import torch
from rlcore.algorithms import mismatch
from rlcore.algorithms.mismatch import mismatch_means, mismatch_metrics
from rlcore.rollout.sync_check import compare_log_probs

LENGTHS = (7, 1, 0, 12, 3)  # ragged, with a row of no response token
WIDTH = 12


def ragged(seed: int, scale: float = 0.3):
    """``(rollout_rows, trainer_rows)``: per row, the log-probs of its response tokens (Python floats), a
    trainer that differs from the rollout by noise of size ``scale``."""
    rng = random.Random(seed)
    rollout, trainer = [], []
    for n in LENGTHS:
        r = [math.log(rng.uniform(0.01, 1.0)) for _ in range(n)]
        rollout.append(r)
        trainer.append([min(0.0, x + rng.gauss(0.0, scale)) for x in r])
    return rollout, trainer


def padded(rows, fill):
    """``[B, WIDTH]`` float32 (as engines return) with ``rows`` left-aligned and ``fill`` after them."""
    out = torch.full((len(rows), WIDTH), fill, dtype=torch.float32)
    for b, row in enumerate(rows):
        out[b, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


def mask_of(rows):
    return torch.tensor([[1] * len(r) + [0] * (WIDTH - len(r)) for r in rows])


def quantile(values, q):
    """Linear interpolation between the order statistics around ``q (n - 1)`` (numpy's default)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (position - low) * (ordered[high] - ordered[low])


def reference(rollout_rows, trainer_rows):
    """Every metric from its definition, in Python floats (float64)."""
    diffs, k3s, ppl_ratios, seq_ratios = [], [], [], []
    for r_row, t_row in zip(rollout_rows, trainer_rows, strict=True):
        for r, t in zip(r_row, t_row, strict=True):
            ratio = math.exp(t) / math.exp(r)  # p_trainer / p_rollout of a token the rollout sampled
            diffs.append(abs(t - r))
            k3s.append((ratio - 1.0) - math.log(ratio))
        if r_row:
            trainer_ppl = math.exp(-sum(t_row) / len(t_row))
            rollout_ppl = math.exp(-sum(r_row) / len(r_row))
            ppl_ratios.append(trainer_ppl / rollout_ppl)
            seq_ratios.append(math.prod(math.exp(t) / math.exp(r) for r, t in zip(r_row, t_row, strict=True)))
    return {
        "logprob_diff_mean": sum(diffs) / len(diffs),
        "logprob_diff_p50": quantile(diffs, 0.5),
        "logprob_diff_p90": quantile(diffs, 0.9),
        "logprob_diff_p99": quantile(diffs, 0.99),
        "logprob_diff_max": max(diffs),
        "mismatch_k3_kl": sum(k3s) / len(k3s),
        "mismatch_ppl_ratio": sum(ppl_ratios) / len(ppl_ratios),
        "mismatch_seq_ratio_max": max(seq_ratios),
        "mismatch_seq_over_cap": sum(w > 3.0 for w in seq_ratios) / len(seq_ratios),
    }


def as_float32(rows):
    """The rows as the float32 tensors carry them, so reference and code see the same inputs."""
    return [torch.tensor(r, dtype=torch.float32).double().tolist() for r in rows]


@pytest.mark.parametrize(("seed", "scale"), [(0, 0.3), (1, 0.3), (2, 0.3), (5, 1.0)])
def test_every_metric_matches_the_float64_definition_on_ragged_rows(seed, scale):
    rollout_rows, trainer_rows = ragged(seed, scale)
    # Padding a metric must never see: huge (exp overflows), NaN, and unequal on the two sides.
    rollout, trainer = padded(rollout_rows, 0.0), padded(trainer_rows, float("nan"))
    trainer[0, 8:] = 1e4  # row 0 holds 7 tokens
    got = mismatch_metrics(rollout, trainer, mask_of(rollout_rows))
    want = reference(as_float32(rollout_rows), as_float32(trainer_rows))
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-15), key
    if scale == 1.0:  # one response of four has a sequence-level weight above 3
        assert got["mismatch_seq_over_cap"] == 0.25
    # The means alone are the same numbers (the loss reports these).
    means = mismatch_means(rollout, trainer, mask_of(rollout_rows))
    assert means == {k: got[k] for k in ("logprob_diff_mean", "mismatch_k3_kl", "mismatch_ppl_ratio")}


def test_the_k3_estimate_is_kl_of_rollout_to_trainer_and_not_the_reverse():
    """Tokens in exact proportion to the rollout's distribution q make the sample mean of k3 the
    expectation under q: exactly KL(q || p) for the trainer's p, which here differs from KL(p || q)."""
    q, p = [0.5, 0.25, 0.25], [0.9, 0.05, 0.05]
    sampled = [0, 0, 1, 2]  # q's proportions
    rollout = torch.tensor([[math.log(q[x]) for x in sampled]], dtype=torch.float64)
    trainer = torch.tensor([[math.log(p[x]) for x in sampled]], dtype=torch.float64)
    got = mismatch_means(rollout, trainer, torch.ones(1, 4))["mismatch_k3_kl"]
    kl_q_p = sum(qi * math.log(qi / pi) for qi, pi in zip(q, p, strict=True))
    kl_p_q = sum(pi * math.log(pi / qi) for qi, pi in zip(q, p, strict=True))
    assert got == pytest.approx(kl_q_p, rel=1e-12)
    assert abs(kl_q_p - kl_p_q) > 0.1  # the two directions are told apart
    # A trainer that finds the samples less likely than the rollout did: its perplexity is the higher.
    assert mismatch_means(rollout, rollout - 0.1, torch.ones(1, 4))["mismatch_ppl_ratio"] == pytest.approx(
        math.exp(0.1), rel=1e-12
    )


def test_agreeing_engines_give_zero_gap_zero_kl_and_ratio_one():
    rollout_rows, _ = ragged(4)
    rollout = padded(rollout_rows, 0.0)
    got = mismatch_metrics(rollout, rollout.clone(), mask_of(rollout_rows))
    assert got == {**{k: 0.0 for k in got}, "mismatch_ppl_ratio": 1.0, "mismatch_seq_ratio_max": 1.0}


def test_tiny_gaps_keep_their_digits():
    """At a 1e-7 gap, (r - 1) - log r is about 5e-15: a naive exp(x) - 1 - x in float64 loses most of
    its digits there."""
    rollout = torch.full((1, 3), -1.0, dtype=torch.float64)
    trainer = rollout + 1e-7
    x = float(trainer[0, 0] - rollout[0, 0])  # the gap as float64 holds it
    got = mismatch_means(rollout, trainer, torch.ones(1, 3))["mismatch_k3_kl"]
    assert got == pytest.approx(x**2 / 2 + x**3 / 6, rel=1e-6, abs=0.0)  # its series, to O(x^4)


def test_an_empty_mask_gives_no_metrics_and_a_wrong_shape_says_which():
    zeros = torch.zeros(2, 3)
    assert mismatch_metrics(zeros, zeros, zeros) == {} and mismatch_means(zeros, zeros, zeros) == {}
    with pytest.raises(ValueError, match=r"rollout \(2, 3\), trainer \(2, 4\) log-probs"):
        mismatch_means(zeros, torch.zeros(2, 4), zeros)


def test_the_post_sync_check_reports_them_under_sync():
    rollout_rows, trainer_rows = ragged(5)
    trainer, mask = padded(trainer_rows, 0.0), mask_of(rollout_rows)
    got = compare_log_probs(rollout_rows, trainer, mask)  # the rollout's rows as Completion lists
    want = reference(rollout_rows, as_float32(trainer_rows))  # lists go in as float64, unrounded
    # Beside the mismatch metrics, the calibrated check's own statistic and its token count.
    extra = {"sync/logprob_diff_trimmed", "sync/probe_tokens"}
    assert sorted(got) == sorted([*(f"sync/{k}" for k in want), *extra])
    assert got["sync/probe_tokens"] == float(mask.sum())
    for key, value in want.items():
        assert got[f"sync/{key}"] == pytest.approx(value, rel=1e-12, abs=1e-15), key


def test_the_module_example_holds():
    assert doctest.testmod(mismatch).failed == 0

"""Algorithms over multi-turn batches (issue 18, item 5): advantages and losses on interleaved masks
such as ``1 1 0 0 1 1 0 1`` (0 = tool-observation token), each against a per-token float64 Python loop
written here from the papers' definitions. Tool tokens get no advantage and contribute no loss or
gradient; the outcome score sits on the last model token (:func:`rlcore.api.place_sequence_scores`).
"""

import math
import random

import pytest
import torch
from rlcore.algorithms import advantages as adv_mod
from rlcore.algorithms.aggregation import agg_loss
from rlcore.algorithms.policy_losses import vanilla
from rlcore.algorithms.value import value_loss
from rlcore.api import place_sequence_scores

MASKS = [
    [1, 1, 0, 0, 1, 1, 0, 1],
    [1, 0, 0, 1, 1, 0, 0, 0],
    [1, 1, 1, 0, 0, 0, 1, 0],
    [1, 1, 0, 1, 0, 1, 1, 1],
    [1, 0, 0, 0, 0, 0, 0, 0],
    [1, 1, 1, 1, 0, 0, 1, 0],
]
UIDS = ["a", "a", "a", "b", "b", "b"]
SCORES = [1.0, 0.0, 0.5, 1.0, 1.0, 0.0]


def mask_tensor():
    return torch.tensor(MASKS, dtype=torch.long)


def outcome_rewards():
    return place_sequence_scores(SCORES, mask_tensor())


def last_model_token(row):
    return max(t for t, m in enumerate(row) if m)


def test_outcome_reward_lands_on_the_last_model_token():
    rewards = outcome_rewards()
    for i, row in enumerate(MASKS):
        for t in range(len(row)):
            assert rewards[i, t].item() == (SCORES[i] if t == last_model_token(row) else 0.0)


def group_stats(values, uids):
    groups = {}
    for v, u in zip(values, uids, strict=True):
        groups.setdefault(u, []).append(v)
    return groups


def test_grpo_broadcasts_the_group_normalised_score_on_model_tokens_only():
    adv, ret = adv_mod.grpo(outcome_rewards(), mask_tensor(), UIDS, epsilon=1e-6)
    groups = group_stats(SCORES, UIDS)
    for i, row in enumerate(MASKS):
        g = groups[UIDS[i]]
        mean = sum(g) / len(g)
        std = math.sqrt(sum((x - mean) ** 2 for x in g) / (len(g) - 1))
        a = 0.0 if max(g) == min(g) else (SCORES[i] - mean) / (std + 1e-6)
        for t, m in enumerate(row):
            assert adv[i, t].item() == pytest.approx(a if m else 0.0, abs=1e-6)
    assert torch.equal(adv, ret)


def test_rloo_leaves_one_out_on_model_tokens_only():
    adv, _ = adv_mod.rloo(outcome_rewards(), mask_tensor(), UIDS)
    for i, row in enumerate(MASKS):
        others = [s for j, s in enumerate(SCORES) if UIDS[j] == UIDS[i] and j != i]
        a = SCORES[i] - sum(others) / len(others)
        for t, m in enumerate(row):
            assert adv[i, t].item() == pytest.approx(a if m else 0.0, abs=1e-6)


def reference_gae(rewards, values, masks, gamma, lam):
    """verl's compute_gae_advantage_return, one token at a time in float64: observation tokens (mask 0)
    neither produce a TD error nor break the recursion; the next value and the running advantage are
    carried through them. Then advantages are whitened over the model tokens of the batch."""
    advantages, returns = [], []
    for r_row, v_row, m_row in zip(rewards, values, masks, strict=True):
        next_value, last = 0.0, 0.0
        row_adv = [0.0] * len(r_row)
        for t in reversed(range(len(r_row))):
            if m_row[t]:
                delta = r_row[t] + gamma * next_value - v_row[t]
                last = delta + gamma * lam * last
                next_value = v_row[t]
            row_adv[t] = last
        advantages.append(row_adv)
        returns.append([a + v if m else 0.0 for a, v, m in zip(row_adv, v_row, m_row, strict=True)])
    flat = [
        a for row, m_row in zip(advantages, masks, strict=True) for a, m in zip(row, m_row, strict=True) if m
    ]
    mean = sum(flat) / len(flat)
    var = sum((a - mean) ** 2 for a in flat) / (len(flat) - 1)
    whitened = [
        [(a - mean) / math.sqrt(var + 1e-8) if m else 0.0 for a, m in zip(row, m_row, strict=True)]
        for row, m_row in zip(advantages, masks, strict=True)
    ]
    return whitened, returns


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.9, 0.5)])
def test_gae_skips_observation_tokens_like_verl(gamma, lam):
    rng = random.Random(3)
    rewards = outcome_rewards().double()
    # Token-level rewards on model tokens too (a KL penalty puts them there).
    for i, row in enumerate(MASKS):
        for t, m in enumerate(row):
            if m:
                rewards[i, t] += rng.uniform(-0.1, 0.1)
    values = torch.tensor([[rng.uniform(-1, 1) for _ in row] for row in MASKS], dtype=torch.float64)
    adv, ret = adv_mod.gae(rewards, values, mask_tensor(), gamma=gamma, lam=lam)
    ref_adv, ref_ret = reference_gae(rewards.tolist(), values.tolist(), MASKS, gamma, lam)
    assert adv.dtype == torch.float64
    torch.testing.assert_close(adv, torch.tensor(ref_adv, dtype=torch.float64), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ret, torch.tensor(ref_ret, dtype=torch.float64), rtol=1e-9, atol=1e-9)
    # Values at observation tokens are never read.
    poked = values.clone()
    poked[~mask_tensor().bool()] = 1e6
    adv2, ret2 = adv_mod.gae(rewards, poked, mask_tensor(), gamma=gamma, lam=lam)
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)


def reference_ppo_token_losses(old, new, adv, masks, eps, c=3.0):
    out = []
    for o_row, n_row, a_row, m_row in zip(old, new, adv, masks, strict=True):
        row = []
        for o, n, a, m in zip(o_row, n_row, a_row, m_row, strict=True):
            if not m:
                row.append(None)
                continue
            ratio = math.exp(max(-20.0, min(20.0, n - o)))
            loss = max(-a * ratio, -a * min(max(ratio, 1 - eps), 1 + eps))
            if a < 0:
                loss = min(loss, -a * c)
            row.append(loss)
        out.append(row)
    return out


def reference_aggregate(losses, mode, scale):
    rows = [[x for x in row if x is not None] for row in losses]
    nonempty = [r for r in rows if r]
    if mode == "token-mean":
        return sum(sum(r) for r in rows) / sum(len(r) for r in rows)
    if mode == "seq-mean-token-sum":
        return sum(sum(r) for r in nonempty) / len(nonempty)
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in nonempty) / len(nonempty)
    return sum(sum(r) for r in nonempty) / (len(nonempty) * scale)


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
def test_ppo_policy_loss_counts_model_tokens_only(mode):
    g = torch.Generator().manual_seed(0)
    mask = mask_tensor()
    old = -torch.rand(mask.shape, generator=g, dtype=torch.float64) * 3
    new = (old + 0.3 * torch.randn(mask.shape, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv, _ = adv_mod.grpo(outcome_rewards(), mask, UIDS)
    adv = adv.double()
    loss, _ = vanilla(old, new, adv, mask, mode, clip_ratio=0.2)
    ref = reference_aggregate(
        reference_ppo_token_losses(old.tolist(), new.tolist(), adv.tolist(), MASKS, 0.2), mode, 8
    )
    assert loss.item() == pytest.approx(ref, rel=1e-9, abs=1e-12)
    loss.backward()
    # No gradient reaches a tool token, and no value there (even inf/NaN) changes the loss.
    assert bool((new.grad[~mask.bool()] == 0).all())
    poked_new, poked_old, poked_adv = new.detach().clone(), old.clone(), adv.clone()
    poked_new[~mask.bool()] = float("nan")
    poked_old[~mask.bool()] = float("inf")
    poked_adv[~mask.bool()] = 123.0
    loss2, _ = vanilla(poked_old, poked_new, poked_adv, mask, mode, clip_ratio=0.2)
    assert loss2.item() == pytest.approx(loss.item(), rel=1e-12)


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
def test_loss_aggregation_split_over_micro_batches_equals_the_whole(mode):
    """A mini-batch split into micro-batches (as engines do) sums to the whole batch's loss when each
    divides by the mini-batch's counts: the interleaved mask counts model tokens only."""
    g = torch.Generator().manual_seed(1)
    mask = mask_tensor()
    losses = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    whole = agg_loss(losses, mask, mode)
    counts = {"global_tokens": int(mask.sum()), "global_sequences": int(mask.any(-1).sum())}
    parts = sum(agg_loss(losses[k : k + 2], mask[k : k + 2], mode, **counts) for k in range(0, 6, 2))
    assert parts.item() == pytest.approx(whole.item(), rel=1e-12)
    rows = [
        [x if m else None for x, m in zip(r, mr, strict=True)]
        for r, mr in zip(losses.tolist(), MASKS, strict=True)
    ]
    assert whole.item() == pytest.approx(reference_aggregate(rows, mode, 8), rel=1e-12)


def test_value_loss_ignores_observation_tokens():
    g = torch.Generator().manual_seed(2)
    mask = mask_tensor()
    vpreds = torch.randn(mask.shape, generator=g, dtype=torch.float64, requires_grad=True)
    returns = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    values = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    loss, _ = value_loss(vpreds, returns, values, mask, cliprange_value=0.5)
    ref_terms = []
    for v_row, g_row, o_row, m_row in zip(
        vpreds.tolist(), returns.tolist(), values.tolist(), MASKS, strict=True
    ):
        for v, ret, old, m in zip(v_row, g_row, o_row, m_row, strict=True):
            if m:
                clipped = min(max(v, old - 0.5), old + 0.5)
                ref_terms.append(max((v - ret) ** 2, (clipped - ret) ** 2))
    assert loss.item() == pytest.approx(0.5 * sum(ref_terms) / len(ref_terms), rel=1e-9)
    loss.backward()
    assert bool((vpreds.grad[~mask.bool()] == 0).all())


def test_dapo_overlong_penalty_counts_the_whole_span_and_lands_on_the_last_model_token():
    from rlcore.algorithms.dapo import apply_overlong_penalty

    mask = mask_tensor()
    span = torch.tensor([8, 5, 7, 8, 1, 7])  # model and tool tokens of each row, as the budget counts them
    scores = outcome_rewards()
    out, penalty = apply_overlong_penalty(scores, mask, 8, 4, 1.0, response_length=span)
    for i, row in enumerate(MASKS):
        expected = min(0.0, -(span[i].item() - (8 - 4)) / 4 * 1.0)
        assert penalty[i].item() == pytest.approx(expected)
        for t in range(8):
            added = expected if t == last_model_token(row) else 0.0
            assert out[i, t].item() == pytest.approx(scores[i, t].item() + added)
    # Without the span, the model tokens alone are the length (the single-turn case).
    _, by_mask = apply_overlong_penalty(scores, mask, 8, 4, 1.0)
    assert by_mask.tolist() == pytest.approx([min(0.0, -(sum(r) - 4) / 4) for r in MASKS])


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_actor_loss_with_entropy_and_kl_terms_counts_model_tokens_only(mode):
    """GRPO's whole actor loss (clip + entropy bonus + low-variance KL to the reference) against a loop;
    the tool tokens' log-probs, entropies and reference log-probs never matter."""
    from rlcore.algorithms.losses import ActorLoss
    from rlcore.api import Batch

    g = torch.Generator().manual_seed(5)
    mask = mask_tensor()
    old = -torch.rand(mask.shape, generator=g, dtype=torch.float64) * 2
    new = old + 0.2 * torch.randn(mask.shape, generator=g, dtype=torch.float64)
    ref = old + 0.3 * torch.randn(mask.shape, generator=g, dtype=torch.float64)
    entropy = torch.rand(mask.shape, generator=g, dtype=torch.float64)
    adv, _ = adv_mod.grpo(outcome_rewards(), mask, UIDS)
    adv = adv.double()
    loss_fn = ActorLoss(
        loss_agg_mode=mode, entropy_coeff=0.01, use_kl_loss=True, kl_loss_type="low_var_kl", kl_loss_coef=0.1
    )

    def run(new, ref, entropy):
        batch = Batch({"old_log_probs": old, "advantages": adv, "response_mask": mask, "ref_log_prob": ref})
        return loss_fn({"log_probs": new, "entropy": entropy}, batch)[0].item()

    pg = reference_ppo_token_losses(old.tolist(), new.tolist(), adv.tolist(), MASKS, 0.2)
    ent = [
        [e if m else None for e, m in zip(er, mr, strict=True)]
        for er, mr in zip(entropy.tolist(), MASKS, strict=True)
    ]
    kl = []
    for n_row, r_row, m_row in zip(new.tolist(), ref.tolist(), MASKS, strict=True):
        row = []
        for n, r, m in zip(n_row, r_row, m_row, strict=True):
            d = max(-20.0, min(20.0, r - n))  # low_var_kl (k3): exp(ref - logp) - (ref - logp) - 1, clamped
            row.append(min(10.0, max(-10.0, math.exp(d) - d - 1)) if m else None)
        kl.append(row)
    expected = (
        reference_aggregate(pg, mode, 8)
        - 0.01 * reference_aggregate(ent, mode, 8)
        + 0.1 * reference_aggregate(kl, mode, 8)
    )
    assert run(new, ref, entropy) == pytest.approx(expected, rel=1e-9)
    tool = ~mask.bool()
    poked = [t.clone() for t in (new, ref, entropy)]
    for t in poked:
        t[tool] = 7.0
    assert run(*poked) == pytest.approx(expected, rel=1e-9)

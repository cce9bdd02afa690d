"""Advantage estimators against float64 references: hand-worked small cases and plain per-sample loops."""

import math
import statistics

import pytest
import torch
from rlcore import algorithms
from rlcore.algorithms import advantages as adv_mod
from rlcore.builtin.algorithms import ADVANTAGE_ESTIMATORS


# ----------------------------------------------------------------------------------- references
def _rows(t):
    return [[float(x) for x in row] for row in t.tolist()]


def ref_scores(rewards):
    return [sum(row) for row in _rows(rewards)]


def ref_groups(index):
    groups = {}
    for i, key in enumerate(index):
        groups.setdefault(key, []).append(i)
    return groups


def ref_whiten(values, mask):
    flat = [v for vr, mr in zip(values, mask, strict=True) for v, m in zip(vr, mr, strict=True) if m]
    if len(flat) < 2:
        return [[0.0] * len(r) for r in values]
    mean = sum(flat) / len(flat)
    var = sum((x - mean) ** 2 for x in flat) / (len(flat) - 1)
    return [
        [(v - mean) / math.sqrt(var + 1e-8) if m else 0.0 for v, m in zip(vr, mr, strict=True)]
        for vr, mr in zip(values, mask, strict=True)
    ]


def ref_gae(rewards, values, mask, gamma, lam):
    """Standard GAE on each row's valid tokens only (observation tokens removed), scattered back."""
    r, v, m = _rows(rewards), _rows(values), _rows(mask)
    adv = [[0.0] * len(row) for row in r]
    ret = [[0.0] * len(row) for row in r]
    for i in range(len(r)):
        pos = [t for t in range(len(r[i])) if m[i][t]]
        next_v, last = 0.0, 0.0
        for t in reversed(pos):
            delta = r[i][t] + gamma * next_v - v[i][t]
            last = delta + gamma * lam * last
            adv[i][t], ret[i][t] = last, last + v[i][t]
            next_v = v[i][t]
    return ref_whiten(adv, m), ret


def ref_returns(rewards, mask, gamma):
    r, m = _rows(rewards), _rows(mask)
    out = [[0.0] * len(row) for row in r]
    for i in range(len(r)):
        g = 0.0
        for t in reversed([t for t in range(len(r[i])) if m[i][t]]):
            g = r[i][t] + gamma * g
            out[i][t] = g
    return out


def ref_grpo(rewards, mask, index, eps=1e-6, norm=True):
    s, groups, m = ref_scores(rewards), ref_groups(index), _rows(mask)
    out = []
    for i, key in enumerate(index):
        vals = [s[j] for j in groups[key]]
        if len(vals) == 1:
            mean, std = 0.0, 1.0
        else:
            mean, std = statistics.fmean(vals), statistics.stdev(vals)
        a = (s[i] - mean) / (std + eps) if norm else s[i] - mean
        out.append([a * x for x in m[i]])
    return out


def ref_rloo(rewards, mask, index):
    s, groups, m = ref_scores(rewards), ref_groups(index), _rows(mask)
    out = []
    for i, key in enumerate(index):
        others = [s[j] for j in groups[key] if j != i]
        a = s[i] - statistics.fmean(others) if others else s[i]
        out.append([a * x for x in m[i]])
    return out


def ref_passk(rewards, mask, index, eps=1e-6, norm=True):
    s, groups, m = ref_scores(rewards), ref_groups(index), _rows(mask)
    per = [0.0] * len(s)
    for rows in groups.values():
        ordered = sorted(rows, key=lambda j: -s[j])
        gap = s[ordered[0]] - s[ordered[1]]
        per[ordered[0]] = gap / (statistics.stdev([s[j] for j in rows]) + eps) if norm else gap
    return [[per[i] * x for x in m[i]] for i in range(len(s))]


def ref_rfpp_baseline(rewards, mask, index):
    s, groups, m = ref_scores(rewards), ref_groups(index), _rows(mask)
    centred = []
    for i, key in enumerate(index):
        vals = [s[j] for j in groups[key]]
        mean = statistics.fmean(vals) if len(vals) > 1 else 0.0
        centred.append([(s[i] - mean) * x for x in m[i]])
    return ref_whiten(centred, m)


def ref_opo(rewards, mask, index):
    s, groups, m = ref_scores(rewards), ref_groups(index), _rows(mask)
    out = []
    for i, key in enumerate(index):
        rows = groups[key]
        lengths = [sum(m[j]) for j in rows]
        b = 0.0
        if len(rows) > 1 and sum(lengths):
            b = sum(n * s[j] for n, j in zip(lengths, rows, strict=True)) / sum(lengths)
        out.append([(s[i] - b) * x for x in m[i]])
    return out


def ref_gpg(rewards, mask, index, f_norm=1.0):
    s, groups, m = ref_scores(rewards), ref_groups(index), _rows(mask)
    alpha = len(s) / max(1, sum(1 for x in s if x != 0))
    out = []
    for i, key in enumerate(index):
        vals = [s[j] for j in groups[key]]
        mean = statistics.fmean(vals) if len(vals) > 1 else 0.0
        out.append([alpha * (s[i] - mean) / f_norm * x for x in m[i]])
    return out


def ref_remax(rewards, mask, baselines):
    g = ref_returns(rewards, mask, 1.0)
    m = _rows(mask)
    b = [float(x) for x in baselines.tolist()]
    return [[(g[i][t] - b[i]) * m[i][t] for t in range(len(g[i]))] for i in range(len(g))], g


# ----------------------------------------------------------------------------------- data
def random_batch(seed, batch=12, length=7, group=3, dense=False, dtype=torch.float64):
    """Outcome rewards on the last valid token (or dense rewards), right-padded masks, one empty row."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    lengths[batch // 2] = 0  # a fully masked row
    mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).to(dtype)
    rewards = torch.zeros(batch, length, dtype=dtype)
    if dense:
        rewards = torch.randn(batch, length, generator=g, dtype=dtype) * mask
    else:
        score = torch.randint(0, 3, (batch,), generator=g).to(dtype) + torch.rand(
            batch, generator=g, dtype=dtype
        )
        for i in range(batch):
            if lengths[i] > 0:
                rewards[i, lengths[i] - 1] = score[i]
    index = [f"p{i // group}" for i in range(batch)]
    return rewards, mask, index


def close(actual, expected, tol=1e-9):
    expected = torch.tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(actual.double(), expected, rtol=tol, atol=tol)


# ----------------------------------------------------------------------------------- hand-worked cases
def test_gae_hand_worked_single_row():
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.2, 0.1]], dtype=torch.float64)
    adv, ret = adv_mod.gae(rewards, values, torch.ones(1, 3), gamma=1.0, lam=1.0)
    # gamma = lam = 1: returns are the reward-to-go (1 everywhere), raw advantages 1 - V.
    close(ret, [[1.0, 1.0, 1.0]])
    raw = [0.5, 0.8, 0.9]
    mean = sum(raw) / 3
    std = math.sqrt(sum((x - mean) ** 2 for x in raw) / 2 + 1e-8)
    close(adv, [[(x - mean) / std for x in raw]])


def test_gae_hand_worked_discounted():
    rewards = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 1.0]], dtype=torch.float64)
    _, ret = adv_mod.gae(rewards, values, torch.ones(1, 2), gamma=0.9, lam=0.5)
    # t=1: delta = 2 - 1 = 1, A = 1.  t=0: delta = 1 + 0.9*1 - 0.5 = 1.4, A = 1.4 + 0.45*1 = 1.85.
    close(ret, [[1.85 + 0.5, 1.0 + 1.0]])


def test_grpo_hand_worked():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 3.0], [5.0, 0.0]], dtype=torch.float64)
    mask = torch.ones(4, 2)
    adv, ret = adv_mod.grpo(rewards, mask, ["a", "a", "a", "b"], epsilon=0.0)
    # group a: scores 1, 0, 3 -> mean 4/3, stdev sqrt(7/3); group b alone -> mean 0, std 1.
    std = math.sqrt(7 / 3)
    close(adv[:, 0], [(1 - 4 / 3) / std, (0 - 4 / 3) / std, (3 - 4 / 3) / std, 5.0])
    assert torch.equal(adv, ret)
    dr, _ = adv_mod.grpo(rewards, mask, ["a", "a", "a", "b"], norm_adv_by_std_in_grpo=False)
    close(dr[:, 1], [1 - 4 / 3, -4 / 3, 3 - 4 / 3, 5.0])


def test_rloo_hand_worked():
    rewards = torch.tensor([[1.0], [0.0], [2.0], [7.0]], dtype=torch.float64)
    adv, _ = adv_mod.rloo(rewards, torch.ones(4, 1), [0, 0, 0, 1])
    close(adv[:, 0], [1 - 1.0, 0 - 1.5, 2 - 0.5, 7.0])


def test_passk_hand_worked():
    rewards = torch.tensor([[0.2], [0.9], [0.5]], dtype=torch.float64)
    adv, _ = adv_mod.grpo_passk(rewards, torch.ones(3, 1), ["q"] * 3, norm_adv_by_std_in_grpo=False)
    close(adv[:, 0], [0.0, 0.9 - 0.5, 0.0])


def test_opo_hand_worked():
    rewards = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.float64)
    adv, _ = adv_mod.opo(rewards, mask, ["g", "g"])
    b = (3 * 1.0 + 1 * 2.0) / 4
    close(adv, [[1 - b] * 3, [2 - b, 0.0, 0.0]])


def test_gpg_hand_worked():
    rewards = torch.tensor([[1.0], [0.0], [0.0], [0.0]], dtype=torch.float64)
    adv, _ = adv_mod.gpg(rewards, torch.ones(4, 1), ["a", "a", "b", "b"], f_norm=2.0)
    alpha = 4 / 1  # one non-zero score out of four
    close(adv[:, 0], [alpha * 0.5 / 2, alpha * -0.5 / 2, 0.0, 0.0])


def test_remax_hand_worked():
    rewards = torch.tensor([[0.0, 0.5, 1.0]], dtype=torch.float64)
    adv, ret = adv_mod.remax(rewards, torch.tensor([[1, 1, 0]]), torch.tensor([0.25], dtype=torch.float64))
    close(ret, [[0.5, 0.5, 0.0]])
    close(adv, [[0.25, 0.25, 0.0]])


# ----------------------------------------------------------------------------------- random vs loop
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_loop(seed):
    rewards, mask, _ = random_batch(seed, dense=True)
    values = torch.randn(
        rewards.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 9)
    )
    adv, ret = adv_mod.gae(rewards, values, mask, gamma=0.95, lam=0.9)
    ref_adv, ref_ret = ref_gae(rewards, values, mask, 0.95, 0.9)
    close(adv, ref_adv)
    close(ret, ref_ret)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("norm", [True, False])
def test_grpo_matches_loop(seed, norm):
    rewards, mask, index = random_batch(seed)
    adv, ret = adv_mod.grpo(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
    close(adv, ref_grpo(rewards, mask, index, norm=norm))
    assert torch.equal(adv, ret)


@pytest.mark.parametrize("seed", [0, 1])
def test_group_estimators_match_loops(seed):
    rewards, mask, index = random_batch(seed, group=4)
    close(adv_mod.rloo(rewards, mask, index)[0], ref_rloo(rewards, mask, index))
    close(adv_mod.grpo_passk(rewards, mask, index)[0], ref_passk(rewards, mask, index))
    close(
        adv_mod.reinforce_plus_plus_baseline(rewards, mask, index)[0], ref_rfpp_baseline(rewards, mask, index)
    )
    close(adv_mod.opo(rewards, mask, index)[0], ref_opo(rewards, mask, index))
    close(adv_mod.gpg(rewards, mask, index, f_norm=1.5)[0], ref_gpg(rewards, mask, index, f_norm=1.5))


@pytest.mark.parametrize("seed", [0, 1])
def test_reinforce_plus_plus_and_remax_match_loops(seed):
    rewards, mask, _ = random_batch(seed, dense=True)
    adv, ret = adv_mod.reinforce_plus_plus(rewards, mask, gamma=0.9)
    close(ret, ref_returns(rewards, mask, 0.9))
    close(adv, ref_whiten(ref_returns(rewards, mask, 0.9), _rows(mask)))
    baselines = torch.randn(
        rewards.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(seed)
    )
    adv, ret = adv_mod.remax(rewards, mask, baselines)
    ref_adv, ref_ret = ref_remax(rewards, mask, baselines)
    close(adv, ref_adv)
    close(ret, ref_ret)


# ----------------------------------------------------------------------------------- edge cases
def test_groups_of_one():
    rewards = torch.tensor([[0.0, 2.0], [0.0, -1.0]], dtype=torch.float64)
    mask, index = torch.ones(2, 2), ["x", "y"]
    close(adv_mod.grpo(rewards, mask, index, epsilon=0.0)[0], [[2.0, 2.0], [-1.0, -1.0]])
    close(adv_mod.rloo(rewards, mask, index)[0], [[2.0, 2.0], [-1.0, -1.0]])
    close(adv_mod.opo(rewards, mask, index)[0], [[2.0, 2.0], [-1.0, -1.0]])
    close(adv_mod.gpg(rewards, mask, index)[0], [[2.0, 2.0], [-1.0, -1.0]])
    close(
        adv_mod.reinforce_plus_plus_baseline(rewards, mask, index)[0], ref_rfpp_baseline(rewards, mask, index)
    )
    with pytest.raises(ValueError, match="at least 2 samples per group"):
        adv_mod.grpo_passk(rewards, mask, index)


@pytest.mark.parametrize("value", [0.1, 1.0, 0.7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_all_equal_rewards_give_exactly_zero(value, dtype):
    rewards = torch.zeros(3, 4, dtype=dtype)
    rewards[:, 3] = value
    mask = torch.ones(3, 4)
    index = ["g"] * 3
    for name in ("grpo", "rloo", "opo", "gpg", "grpo_passk", "reinforce_plus_plus_baseline"):
        adv, _ = algorithms.compute_advantage(
            name, token_level_rewards=rewards, response_mask=mask, index=index
        )
        assert torch.count_nonzero(adv) == 0, name


def test_fully_masked_rows_get_zero_and_do_not_break_groups():
    rewards, mask, index = random_batch(3)
    empty = mask.sum(-1) == 0
    assert empty.any()
    values = torch.randn(rewards.shape, dtype=torch.float64)
    for name in ADVANTAGE_ESTIMATORS:
        inputs = dict(token_level_rewards=rewards, response_mask=mask, index=index, values=values)
        inputs["reward_baselines"] = torch.ones(rewards.shape[0], dtype=torch.float64)
        adv, ret = algorithms.compute_advantage(name, **inputs)
        assert torch.isfinite(adv).all() and torch.isfinite(ret).all(), name
        assert torch.count_nonzero(adv[empty]) == 0 and torch.count_nonzero(ret[empty]) == 0, name
        assert torch.count_nonzero(adv * (1 - mask)) == 0, name


def test_everything_masked():
    rewards, mask = torch.zeros(2, 3), torch.zeros(2, 3)
    adv, ret = adv_mod.gae(rewards, torch.ones(2, 3), mask)
    assert torch.count_nonzero(adv) == 0 and torch.count_nonzero(ret) == 0
    adv, _ = adv_mod.reinforce_plus_plus(rewards, mask)
    assert torch.count_nonzero(adv) == 0


def multi_turn_batch():
    # Two turns of model tokens with a tool observation (mask 0) between them, then padding.
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0], [1, 0, 0, 1, 1, 1, 1]], dtype=torch.float64)
    rewards = torch.zeros(2, 7, dtype=torch.float64)
    rewards[0, 5], rewards[1, 6] = 1.0, -0.5
    return rewards, mask


def test_gae_skips_observation_tokens():
    rewards, mask = multi_turn_batch()
    values = torch.randn(2, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    adv, ret = adv_mod.gae(rewards, values, mask, gamma=0.9, lam=0.8)
    ref_adv, ref_ret = ref_gae(rewards, values, mask, 0.9, 0.8)
    close(adv, ref_adv)
    close(ret, ref_ret)
    # The critic's values on observation tokens must not matter.
    other = values.clone()
    other[mask == 0] = 100.0
    adv2, ret2 = adv_mod.gae(rewards, other, mask, gamma=0.9, lam=0.8)
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)
    # The first turn sees the outcome reward through the observation: with lam=1 and zero values the
    # return is the reward discounted over the valid tokens after it (t=4, t=5), not over positions.
    _, ret3 = adv_mod.gae(rewards[:1], torch.zeros(1, 7), mask[:1], gamma=0.9, lam=1.0)
    close(ret3[0, :2], [0.9**3, 0.9**2])


def test_reinforce_plus_plus_carries_return_through_observations():
    rewards, mask = multi_turn_batch()
    _, ret = adv_mod.reinforce_plus_plus(rewards, mask, gamma=0.5)
    close(ret, ref_returns(rewards, mask, 0.5))
    close(ret[0], [0.125, 0.25, 0.0, 0.0, 0.5, 1.0, 0.0])


@pytest.mark.parametrize(
    "name", ["grpo", "rloo", "opo", "gpg", "reinforce_plus_plus_baseline", "gae", "remax"]
)
def test_bf16_inputs(name):
    rewards, mask, index = random_batch(5, dense=name in ("gae", "remax"), dtype=torch.float64)
    values = torch.randn(rewards.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    baselines = torch.randn(rewards.shape[0], dtype=torch.float64)
    low = dict(
        token_level_rewards=rewards.bfloat16(),
        response_mask=mask.bfloat16(),
        index=index,
        values=values.bfloat16(),
        reward_baselines=baselines.bfloat16(),
    )
    adv, ret = algorithms.compute_advantage(name, **low)
    assert adv.dtype == torch.float32 and ret.dtype == torch.float32
    # Reference: the same bf16-rounded numbers, in float64. Agreement to float32 precision shows that no
    # arithmetic happened in bf16.
    exact = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in low.items()}
    ref_adv, ref_ret = algorithms.compute_advantage(name, **exact)
    rounded = {
        "grpo": lambda: ref_grpo(exact["token_level_rewards"], mask, index),
        "rloo": lambda: ref_rloo(exact["token_level_rewards"], mask, index),
        "opo": lambda: ref_opo(exact["token_level_rewards"], mask, index),
        "gpg": lambda: ref_gpg(exact["token_level_rewards"], mask, index),
        "reinforce_plus_plus_baseline": lambda: ref_rfpp_baseline(exact["token_level_rewards"], mask, index),
        "gae": lambda: ref_gae(exact["token_level_rewards"], exact["values"], mask, 1.0, 1.0)[0],
        "remax": lambda: ref_remax(exact["token_level_rewards"], mask, exact["reward_baselines"])[0],
    }[name]()
    close(ref_adv, rounded)
    torch.testing.assert_close(adv.double(), torch.tensor(rounded, dtype=torch.float64), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------- inputs
def test_index_may_be_a_tensor_or_numpy_array():
    np = pytest.importorskip("numpy")
    rewards, mask, index = random_batch(6)
    as_ints = [int(k[1:]) for k in index]
    expected = adv_mod.grpo(rewards, mask, index)[0]
    assert torch.equal(adv_mod.grpo(rewards, mask, torch.tensor(as_ints))[0], expected)
    assert torch.equal(adv_mod.grpo(rewards, mask, np.array(index, dtype=object))[0], expected)


def test_bad_inputs_name_the_argument():
    rewards, mask, index = random_batch(0)
    with pytest.raises(ValueError, match="index has 3 entries"):
        adv_mod.grpo(rewards, mask, index[:3])
    with pytest.raises(ValueError, match="response_mask has shape"):
        adv_mod.grpo(rewards, mask[:, :2], index)
    with pytest.raises(ValueError, match="reward_baselines must be"):
        adv_mod.remax(rewards, mask, torch.zeros(2))
    with pytest.raises(TypeError, match="needs 'values'"):
        algorithms.compute_advantage("gae", token_level_rewards=rewards, response_mask=mask, values=None)
    with pytest.raises(TypeError, match="needs 'index'"):
        algorithms.compute_advantage("grpo", token_level_rewards=rewards, response_mask=mask)


def test_compute_advantage_passes_verl_keywords():
    rewards, mask, index = random_batch(2)
    values = torch.zeros_like(rewards)
    everything = dict(
        token_level_rewards=rewards,
        response_mask=mask,
        index=index,
        values=values,
        gamma=0.9,
        lam=0.5,
        epsilon=1e-6,
        norm_adv_by_std_in_grpo=False,
        reward_baselines=torch.zeros(rewards.shape[0], dtype=torch.float64),
    )
    adv, _ = algorithms.compute_advantage("grpo", **everything)
    close(adv, ref_grpo(rewards, mask, index, norm=False))
    _, ret = algorithms.compute_advantage("gae", **everything)
    close(ret, ref_gae(rewards, values, mask, 0.9, 0.5)[1])

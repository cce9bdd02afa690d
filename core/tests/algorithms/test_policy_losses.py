"""Policy losses against per-token float64 loops (values and gradients), plus edge cases."""

import math

import pytest
import torch
from rlcore import algorithms
from rlcore.algorithms import policy_losses as pl

MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


# ----------------------------------------------------------------------------------- references
def ref_agg(terms, mask, mode, global_tokens=None, global_sequences=None, scale=None):
    """``terms[i][t]``: scalar tensors (or floats) on valid tokens; a plain loop over rows and tokens."""
    rows = [[terms[i][t] for t in range(len(mask[i])) if mask[i][t]] for i in range(len(mask))]
    tokens = sum(len(r) for r in rows)
    seqs = sum(1 for r in rows if r)
    if mode == "token-mean":
        total = sum(x for r in rows for x in r)
        return total / max(global_tokens if global_tokens is not None else tokens, 1)
    n = max(global_sequences if global_sequences is not None else seqs, 1)
    if mode == "seq-mean-token-sum":
        return sum(sum(r) for r in rows if r) / n
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows if r) / n
    return sum(sum(r) for r in rows if r) / (n * (scale or len(mask[0])))


def per_token(fn, lp, old, adv, mask):
    """Apply ``fn(lp_t, old_t, a_t) -> scalar tensor`` to every valid token of leaf ``lp``."""
    m = mask.tolist()
    out = [[None] * len(m[0]) for _ in m]
    for i in range(len(m)):
        for t in range(len(m[0])):
            if m[i][t]:
                out[i][t] = fn(lp[i, t], float(old[i, t]), float(adv[i, t]))
    return out


def ref_vanilla(lp, old, adv, mask, mode, low=0.2, high=0.2, c=3.0, weights=None, **counts):
    def token(x, o, a):
        lr = torch.clamp(x - o, -20.0, 20.0)
        r = torch.exp(lr)
        l1 = -a * r
        l2 = -a * torch.clamp(r, 1 - low, 1 + high)
        loss = torch.maximum(l1, l2)
        return torch.minimum(loss, torch.tensor(-a * c, dtype=loss.dtype)) if a < 0 else loss

    terms = per_token(token, lp, old, adv, mask)
    if weights is not None:
        terms = [
            [x * float(w) if x is not None else None for x, w in zip(row, wr, strict=True)]
            for row, wr in zip(terms, weights, strict=True)
        ]
    return ref_agg(terms, mask.tolist(), mode, **counts)


def ref_gspo(lp, old, adv, mask, mode, low=0.2, high=0.2, **counts):
    m = mask.tolist()
    terms = [[None] * len(m[0]) for _ in m]
    for i in range(len(m)):
        valid = [t for t in range(len(m[i])) if m[i][t]]
        if not valid:
            continue
        s = math.exp(sum(float(lp.detach()[i, t]) - float(old[i, t]) for t in valid) / len(valid))
        for t in valid:
            # Value s, gradient s * d lp_t: exp(lp_t - value of lp_t) is 1 with derivative 1.
            st = s * torch.exp(lp[i, t] - float(lp.detach()[i, t]))
            a = float(adv[i, t])
            terms[i][t] = torch.maximum(-a * st, -a * torch.clamp(st, 1 - low, 1 + high))
    return ref_agg(terms, m, mode, **counts)


def ref_cispo(lp, old, adv, mask, mode, low=0.2, high=0.2, **counts):
    def token(x, o, a):
        w = min(max(math.exp(min(max(float(x.detach()) - o, -20), 20)), 1 - low), 1 + high)
        return -w * a * x

    return ref_agg(per_token(token, lp, old, adv, mask), mask.tolist(), mode, **counts)


def ref_gpg(lp, old, adv, mask, mode, **counts):
    return ref_agg(per_token(lambda x, o, a: -a * x, lp, old, adv, mask), mask.tolist(), mode, **counts)


def ref_geo_mean(lp, old, adv, mask, low=0.2, high=0.2, global_sequences=None):
    m = mask.tolist()
    per_seq = []
    for i in range(len(m)):
        valid = [t for t in range(len(m[i])) if m[i][t]]
        if not valid:
            continue
        bounded = []
        for t in valid:
            x = lp[i, t] - float(old[i, t])
            a = float(adv[i, t])
            if a > 0:
                bounded.append(x if float(x.detach()) <= high else torch.tensor(high, dtype=x.dtype))
            elif a < 0:
                bounded.append(x if float(x.detach()) >= -low else torch.tensor(-low, dtype=x.dtype))
            else:
                bounded.append(0.0 * x)
        a_bar = sum(float(adv[i, t]) for t in valid) / len(valid)
        per_seq.append(-a_bar * torch.exp(sum(bounded) / len(valid)))
    return sum(per_seq) / (global_sequences if global_sequences is not None else max(len(per_seq), 1))


def ref_cov(lp, adv, mask):
    """Row-major valid tokens and their ``(A - mean A)(log p - mean log p)``."""
    cells = [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t]]
    a = [float(adv[i, t]) for i, t in cells]
    p = [float(lp[i, t]) for i, t in cells]
    ma, mp = sum(a) / len(a), sum(p) / len(p)
    return cells, [(x - ma) * (y - mp) for x, y in zip(a, p, strict=True)]


# ----------------------------------------------------------------------------------- data
def make_inputs(seed, batch=6, length=5, spread=0.3, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=g, dtype=torch.float64) * 3
    lp = old + torch.randn(batch, length, generator=g, dtype=torch.float64) * spread
    adv = torch.randn(batch, length, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    lengths[1] = 0
    mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.float64)
    return lp.to(dtype).requires_grad_(), old.to(dtype), adv.to(dtype), mask


def grads(loss, leaf):
    (g,) = torch.autograd.grad(loss, leaf)
    return g


def assert_matches(fn_loss, ref_loss, lp, tol=1e-10):
    torch.testing.assert_close(fn_loss.double(), torch.as_tensor(ref_loss).double(), rtol=tol, atol=tol)
    torch.testing.assert_close(grads(fn_loss, lp), grads(ref_loss, lp), rtol=tol, atol=tol)


# ----------------------------------------------------------------------------------- hand-worked
def test_vanilla_hand_worked():
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5]], dtype=torch.float64))
    # ratios 1.5 (A>0: clipped at 1.2), 0.5 (A<0: clipped at 0.8), 5.0 (A<0: dual-clip at c=3), 1.1
    lp = torch.log(torch.tensor([[0.75, 0.25, 2.5, 0.55]], dtype=torch.float64))
    adv = torch.tensor([[1.0, -1.0, -2.0, 0.5]], dtype=torch.float64)
    loss, m = pl.vanilla(old, lp, adv, torch.ones(1, 4), clip_ratio=0.2, clip_ratio_c=3.0)
    expected = [-1.2, 0.8, 6.0, -0.55]
    torch.testing.assert_close(loss, torch.tensor(sum(expected) / 4, dtype=torch.float64))
    # The clipped term is the larger one for ratios 1.5 (A>0) and 0.5 (A<0); for ratio 5 with A<0 the
    # unclipped term (10) is larger, and the dual clip caps it at -A * c = 6.
    assert m["actor/pg_clipfrac"] == pytest.approx(2 / 4)
    assert m["actor/pg_clipfrac_lower"] == pytest.approx(1 / 4)


def test_vanilla_clip_higher_is_asymmetric():
    old = torch.zeros(1, 2, dtype=torch.float64)
    lp = torch.log(torch.tensor([[1.25, 0.75]], dtype=torch.float64))
    adv = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    loss, _ = pl.vanilla(old, lp, adv, torch.ones(1, 2), clip_ratio_low=0.2, clip_ratio_high=0.28)
    # 1.25 < 1.28 is not clipped for A>0; 0.75 < 0.8 is clipped for A<0 (loss -(-1)*0.8).
    torch.testing.assert_close(loss, torch.tensor((-1.25 + 0.8) / 2, dtype=torch.float64))


def test_gspo_uses_sequence_ratio():
    old = torch.zeros(1, 2, dtype=torch.float64)
    lp = torch.tensor([[0.1, -0.3]], dtype=torch.float64)  # geometric-mean ratio exp(-0.1)
    adv = torch.tensor([[2.0, 2.0]], dtype=torch.float64)
    loss, _ = pl.gspo(old, lp, adv, torch.ones(1, 2), clip_ratio=0.5)
    torch.testing.assert_close(loss, torch.tensor(-2.0 * math.exp(-0.1), dtype=torch.float64))


# ----------------------------------------------------------------------------------- random vs loop
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [0, 1])
def test_vanilla_matches_loop(mode, seed):
    lp, old, adv, mask = make_inputs(seed, spread=0.4)
    loss, _ = pl.vanilla(old, lp, adv, mask, mode, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=2.0)
    assert_matches(loss, ref_vanilla(lp, old, adv, mask, mode, low=0.2, high=0.28, c=2.0), lp)


@pytest.mark.parametrize("mode", MODES)
def test_gspo_matches_loop(mode):
    lp, old, adv, mask = make_inputs(2, spread=0.05)
    loss, _ = pl.gspo(old, lp, adv, mask, mode, clip_ratio_low=0.01, clip_ratio_high=0.02)
    assert_matches(loss, ref_gspo(lp, old, adv, mask, mode, low=0.01, high=0.02), lp)


@pytest.mark.parametrize("mode", MODES)
def test_cispo_and_gpg_match_loops(mode):
    lp, old, adv, mask = make_inputs(3, spread=0.4)
    loss, m = pl.cispo(old, lp, adv, mask, mode, clip_ratio_low=0.1, clip_ratio_high=0.15)
    assert_matches(loss, ref_cispo(lp, old, adv, mask, mode, low=0.1, high=0.15), lp)
    ratio = torch.exp(lp.detach() - old)
    clipped = ((ratio < 0.9) | (ratio > 1.15)).double()
    assert m["actor/pg_clipfrac"] == pytest.approx(float((clipped * mask).sum() / mask.sum()))
    loss, _ = pl.gpg(old, lp, adv, mask, mode)
    assert_matches(loss, ref_gpg(lp, old, adv, mask, mode), lp)


@pytest.mark.parametrize("seed", [0, 4])
def test_geo_mean_matches_loop(seed):
    lp, old, adv, mask = make_inputs(seed, spread=0.3)
    adv = adv.clone()
    adv[0, 0] = 0.0  # sign 0: the token contributes neither ratio nor advantage
    loss, _ = pl.geo_mean(old, lp, adv, mask, clip_ratio_low=0.1, clip_ratio_high=0.2)
    assert_matches(loss, ref_geo_mean(lp, old, adv, mask, low=0.1, high=0.2), lp)


def test_clip_cov_cuts_all_candidates_when_budget_allows():
    lp, old, adv, mask = make_inputs(5, batch=8, length=6, spread=0.3)
    cells, cov = ref_cov(lp.detach(), adv, mask)
    lb, ub = 0.05, 5.0
    ratio = torch.exp(lp.detach() - old)
    candidates = []
    for (i, t), c in zip(cells, cov, strict=True):
        a, r = float(adv[i, t]), float(ratio[i, t])
        clipped_by_ppo = -a * min(max(r, 0.8), 1.2) > -a * r
        if lb < c < ub and not clipped_by_ppo:
            candidates.append((i, t))
    assert 2 <= len(candidates) < len(cells)
    loss, m = pl.clip_cov(old, lp, adv, mask, clip_cov_ratio=1.0, clip_cov_lb=lb, clip_cov_ub=ub)

    def token(x, o, a):
        r = torch.exp(x - o)
        return torch.maximum(-a * r, -a * torch.clamp(r, 0.8, 1.2))

    terms = per_token(token, lp, old, adv, mask)
    for i, t in candidates:
        terms[i][t] = terms[i][t] * 0.0
    assert_matches(loss, ref_agg(terms, mask.tolist(), "token-mean"), lp)
    assert m["actor/pg_clipfrac"] == pytest.approx(len(candidates) / len(cells))


def test_clip_cov_random_draw_takes_its_budget_from_the_candidates():
    lp, old, adv, mask = make_inputs(6, batch=10, length=8, spread=0.3)
    lb, ub, ratio_ = -10.0, 10.0, 0.1
    n_cut = max(int(ratio_ * int(mask.sum())), 1)
    loss, m = pl.clip_cov(
        old,
        lp,
        adv,
        mask,
        clip_cov_ratio=ratio_,
        clip_cov_lb=lb,
        clip_cov_ub=ub,
        generator=torch.Generator().manual_seed(7),
    )
    # Reference: candidates in row-major order, the same seeded permutation picks n_cut of them.
    r = torch.exp(lp.detach() - old)
    candidates = [
        (i, t)
        for i, t in ref_cov(lp.detach(), adv, mask)[0]
        if not (-float(adv[i, t]) * min(max(float(r[i, t]), 0.8), 1.2) > -float(adv[i, t]) * float(r[i, t]))
    ]
    assert len(candidates) > n_cut
    picked = torch.randperm(len(candidates), generator=torch.Generator().manual_seed(7))[:n_cut].tolist()
    terms = per_token(
        lambda x, o, a: torch.maximum(-a * torch.exp(x - o), -a * torch.clamp(torch.exp(x - o), 0.8, 1.2)),
        lp,
        old,
        adv,
        mask,
    )
    for k in picked:
        i, t = candidates[k]
        terms[i][t] = terms[i][t] * 0.0
    assert_matches(loss, ref_agg(terms, mask.tolist(), "token-mean"), lp)
    assert m["actor/pg_clipfrac"] == pytest.approx(n_cut / float(mask.sum()))


def test_kl_cov_penalises_top_covariance_tokens():
    lp, old, adv, mask = make_inputs(7, batch=10, length=8, spread=0.3)
    ratio_, coef = 0.1, 0.5
    cells, cov = ref_cov(lp.detach(), adv, mask)
    k = max(1, int(len(cells) * ratio_))
    top = {cells[j] for j in sorted(range(len(cells)), key=lambda j: -cov[j])[:k]}
    loss, _ = pl.kl_cov(old, lp, adv, mask, kl_cov_ratio=ratio_, ppo_kl_coef=coef)

    terms = per_token(lambda x, o, a: -a * torch.exp(x - o), lp, old, adv, mask)
    for i, t in top:
        terms[i][t] = terms[i][t] + coef * torch.abs(lp[i, t] - float(old[i, t]))
    assert_matches(loss, ref_agg(terms, mask.tolist(), "token-mean"), lp)


# ----------------------------------------------------------------------------------- edge cases
@pytest.mark.parametrize("name", ["vanilla", "gspo", "cispo", "gpg", "geo_mean", "clip_cov", "kl_cov"])
def test_masked_garbage_never_leaks(name):
    lp, old, adv, mask = make_inputs(8)
    fn = algorithms.get_policy_loss(name)
    clean, _ = fn(old, lp, adv, mask)
    expected = grads(clean, lp)
    dirty_lp = torch.where(
        mask.bool(), lp.detach(), torch.tensor(-math.inf, dtype=torch.float64)
    ).requires_grad_()
    dirty_old = torch.where(mask.bool(), old, torch.tensor(math.nan, dtype=torch.float64))
    dirty_adv = torch.where(mask.bool(), adv, torch.tensor(math.inf, dtype=torch.float64))
    loss, metrics = fn(dirty_old, dirty_lp, dirty_adv, mask)
    assert torch.isfinite(loss) and all(math.isfinite(v) for v in metrics.values())
    torch.testing.assert_close(loss, clean.detach())
    torch.testing.assert_close(grads(loss, dirty_lp), expected)


def test_fully_masked_batch_gives_zero_not_nan():
    lp, old, adv, _ = make_inputs(9)
    mask = torch.zeros_like(old)
    for name in ("vanilla", "gspo", "cispo", "gpg", "geo_mean", "clip_cov", "kl_cov"):
        for mode in MODES:
            loss, _ = algorithms.get_policy_loss(name)(old, lp, adv, mask, mode)
            assert loss.item() == 0.0, (name, mode)
            assert torch.count_nonzero(grads(loss, lp)) == 0


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_extreme_ratios(mode):
    old = torch.full((2, 4), -1.0, dtype=torch.float64)
    shifts = torch.tensor([[60.0, -60.0, 25.0, -25.0], [60.0, -60.0, 0.01, 1e3]], dtype=torch.float64)
    lp = (old + shifts).requires_grad_()
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0], [-1.0, -1.0, 0.5, 2.0]], dtype=torch.float64)
    mask = torch.ones(2, 4)
    loss, _ = pl.vanilla(old, lp, adv, mask, mode, clip_ratio_c=3.0)
    assert torch.isfinite(loss)
    assert_matches(loss, ref_vanilla(lp, old, adv, mask, mode), lp)
    loss, _ = pl.cispo(old, lp, adv, mask, mode)
    assert_matches(loss, ref_cispo(lp, old, adv, mask, mode), lp)
    for name in ("gspo", "geo_mean", "clip_cov", "kl_cov"):
        loss, _ = algorithms.get_policy_loss(name)(old, lp, adv, mask, mode)
        assert torch.isfinite(loss) and torch.isfinite(grads(loss, lp)).all(), name


def test_dual_clip_caps_an_exploded_ratio():
    old = torch.zeros(1, 1, dtype=torch.float64)
    lp = torch.full((1, 1), 60.0, dtype=torch.float64, requires_grad=True)
    loss, m = pl.vanilla(
        old, lp, torch.full((1, 1), -1.5, dtype=torch.float64), torch.ones(1, 1), clip_ratio_c=3.0
    )
    assert loss.item() == pytest.approx(4.5)
    assert m["actor/pg_clipfrac_lower"] == 1.0
    assert grads(loss, lp).item() == 0.0


@pytest.mark.parametrize("name", ["vanilla", "cispo", "gpg", "gspo", "geo_mean"])
def test_bf16_inputs(name):
    lp64, old64, adv64, mask = make_inputs(10, spread=0.3)
    lp = lp64.detach().bfloat16().requires_grad_()
    old, adv = old64.bfloat16(), adv64.bfloat16()
    loss, _ = algorithms.get_policy_loss(name)(old, lp, adv, mask)
    assert loss.dtype == torch.float32
    g = grads(loss, lp)
    assert g.dtype == torch.bfloat16
    # Reference on the same bf16-rounded numbers in float64.
    exact = lp.detach().double().requires_grad_()
    ref, _ = algorithms.get_policy_loss(name)(old.double(), exact, adv.double(), mask)
    torch.testing.assert_close(loss.double(), ref.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g.double(), grads(ref, exact), rtol=1e-2, atol=1e-3)


def test_dual_clip_needs_c_above_one():
    lp, old, adv, mask = make_inputs(0)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        pl.vanilla(old, lp, adv, mask, clip_ratio_c=1.0)


def test_unknown_agg_mode_lists_modes():
    lp, old, adv, mask = make_inputs(0)
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        pl.vanilla(old, lp, adv, mask, "token-sum")


def test_shape_mismatch_names_the_argument():
    lp, old, adv, mask = make_inputs(0)
    with pytest.raises(ValueError, match="advantages has shape"):
        pl.vanilla(old, lp, adv[:, :2], mask)


def test_rollout_is_weights_scale_each_token():
    lp, old, adv, mask = make_inputs(11)
    w = torch.rand(old.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) + 0.5
    loss, _ = pl.vanilla(old, lp, adv, mask, rollout_is_weights=w)
    assert_matches(loss, ref_vanilla(lp, old, adv, mask, "token-mean", weights=w), lp)


@pytest.mark.parametrize("name", ["vanilla", "gspo", "cispo", "gpg", "geo_mean"])
@pytest.mark.parametrize("mode", MODES)
def test_global_normalisation_sums_over_micro_batches(name, mode):
    lp, old, adv, mask = make_inputs(12, batch=9, length=6)
    fn = algorithms.get_policy_loss(name)
    whole, _ = fn(old, lp, adv, mask, mode)
    counts = algorithms.global_batch_counts(mask)
    parts = [
        fn(old[s], lp[s], adv[s], mask[s], mode, loss_scale_factor=6, **counts)[0]
        for s in (slice(0, 2), slice(2, 7), slice(7, 9))
    ]
    total = sum(parts)
    torch.testing.assert_close(total, whole, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grads(total, lp), grads(whole, lp), rtol=1e-12, atol=1e-12)

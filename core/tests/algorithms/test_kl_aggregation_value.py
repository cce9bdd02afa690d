"""Loss aggregation, KL penalties and controllers, value loss and entropy against hand values and loops."""

import math

import pytest
import torch
from rlcore import algorithms
from rlcore.algorithms import agg_loss, kl_penalty

# ----------------------------------------------------------------------------------- aggregation
LOSS = torch.tensor([[1.0, 2.0, 9.0], [4.0, 9.0, 9.0], [9.0, 9.0, 9.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 7 / 3),
        ("seq-mean-token-sum", (3 + 4) / 2),
        ("seq-mean-token-mean", (1.5 + 4) / 2),
        ("seq-mean-token-sum-norm", (3 + 4) / (2 * 3)),
    ],
)
def test_agg_loss_hand_worked(mode, expected):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_agg_loss_with_global_counts():
    assert agg_loss(LOSS, MASK, "token-mean", global_tokens=6).item() == pytest.approx(7 / 6)
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum", global_sequences=4).item() == pytest.approx(7 / 4)
    assert agg_loss(LOSS, MASK, "seq-mean-token-mean", global_sequences=4).item() == pytest.approx(5.5 / 4)
    value = agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", global_sequences=4, loss_scale_factor=10)
    assert value.item() == pytest.approx(7 / 40)


def test_agg_loss_ignores_nan_outside_mask_and_empty_batch_is_zero():
    dirty = torch.where(MASK.bool(), LOSS, torch.tensor(math.nan, dtype=torch.float64))
    assert agg_loss(dirty, MASK, "token-mean").item() == pytest.approx(7 / 3)
    for mode in algorithms.LOSS_AGG_MODES:
        assert agg_loss(LOSS, torch.zeros_like(MASK), mode).item() == 0.0


def test_agg_loss_accumulates_bf16_in_float32():
    loss = torch.full((1, 4096), 1.0 + 2**-7, dtype=torch.bfloat16)
    out = agg_loss(loss, torch.ones(1, 4096), "seq-mean-token-sum")
    assert out.dtype == torch.float32
    assert out.item() == 4096 * (1.0 + 2**-7)


def test_agg_loss_errors():
    with pytest.raises(ValueError, match="token-mean"):
        agg_loss(LOSS, MASK, "mean")
    with pytest.raises(ValueError, match="differ in shape"):
        agg_loss(LOSS, MASK[:, :2], "token-mean")


def test_global_batch_counts():
    assert algorithms.global_batch_counts(MASK) == {"global_tokens": 3, "global_sequences": 2}


# ----------------------------------------------------------------------------------- KL
def ref_kl(lp, ref, kind):
    d = lp - ref
    base = kind.rstrip("+")
    if base in ("kl", "k1"):
        return d
    if base == "abs":
        return abs(d)
    if base in ("mse", "k2"):
        return 0.5 * d * d
    log_r = min(max(-d, -20.0), 20.0)
    return min(max(math.exp(log_r) - log_r - 1.0, -10.0), 10.0)


def test_kl_hand_worked():
    lp, ref = torch.log(torch.tensor([[0.5]])), torch.log(torch.tensor([[0.25]]))
    ln2 = math.log(2)
    assert kl_penalty(lp, ref, "kl").item() == pytest.approx(ln2)
    assert kl_penalty(ref, lp, "abs").item() == pytest.approx(ln2)
    assert kl_penalty(lp, ref, "mse").item() == pytest.approx(0.5 * ln2**2)
    assert kl_penalty(lp, ref, "low_var_kl").item() == pytest.approx(0.5 + ln2 - 1)


@pytest.mark.parametrize("kind", algorithms.KL_PENALTY_KINDS)
def test_kl_matches_loop_and_straight_through_gradient(kind):
    g = torch.Generator().manual_seed(0)
    ref = -torch.rand(4, 5, generator=g, dtype=torch.float64) * 4
    lp = (ref + torch.randn(4, 5, generator=g, dtype=torch.float64) * 2).requires_grad_()
    lp.data[0, 0] = ref[0, 0] - 30.0  # beyond the k3 clamps
    out = kl_penalty(lp, ref, kind)
    expected = [
        [ref_kl(float(a), float(b), kind) for a, b in zip(ra, rb, strict=True)]
        for ra, rb in zip(lp.tolist(), ref.tolist(), strict=True)
    ]
    torch.testing.assert_close(out.detach(), torch.tensor(expected, dtype=torch.float64))
    (grad,) = torch.autograd.grad(out.sum(), lp)
    d = (lp - ref).detach()
    base = kind.rstrip("+")
    if kind.endswith("+") or base in ("mse", "k2"):
        expected_grad = d  # k2's gradient
    elif base in ("kl", "k1"):
        expected_grad = torch.ones_like(d)
    elif base == "abs":
        expected_grad = torch.sign(d)
    else:
        # d/dlp (exp(-d) + d - 1) = 1 - exp(-d), zero where a clamp is active.
        log_r = -d
        inside = (log_r.abs() < 20) & ((torch.exp(log_r) - log_r - 1).abs() < 10)
        expected_grad = torch.where(inside, 1 - torch.exp(-d), torch.zeros_like(d))
    torch.testing.assert_close(grad, expected_grad)


def test_kl_bf16_computes_in_float32():
    lp = torch.tensor([[-1.0, -2.5]], dtype=torch.bfloat16)
    ref = torch.tensor([[-1.5, -2.0]], dtype=torch.bfloat16)
    out = kl_penalty(lp, ref, "low_var_kl")
    assert out.dtype == torch.float32
    expected = [ref_kl(-1.0, -1.5, "k3"), ref_kl(-2.5, -2.0, "k3")]
    torch.testing.assert_close(out, torch.tensor([expected]), rtol=1e-6, atol=1e-7)


def test_unknown_kl_kind_lists_kinds():
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k4")
    with pytest.raises(ValueError, match="full-vocabulary"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "full")


def test_kl_controllers():
    fixed = algorithms.make_kl_controller("fixed", kl_coef=0.05)
    fixed.update(current_kl=10.0, n_steps=100)
    assert fixed.value == 0.05
    adaptive = algorithms.make_kl_controller("adaptive", kl_coef=0.1, target_kl=0.1, horizon=100)
    adaptive.update(current_kl=0.15, n_steps=10)  # error 0.5 clipped to 0.2
    assert adaptive.value == pytest.approx(0.1 * (1 + 0.2 * 10 / 100))
    adaptive.update(current_kl=0.09, n_steps=50)  # error -0.1
    assert adaptive.value == pytest.approx(0.1 * 1.02 * (1 - 0.1 * 50 / 100))
    with pytest.raises(ValueError, match="horizon"):
        algorithms.make_kl_controller("adaptive", horizon=0)
    with pytest.raises(ValueError, match="'fixed' or 'adaptive'"):
        algorithms.make_kl_controller("pid")


def test_apply_kl_penalty_matches_loop():
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(3, 4, generator=g, dtype=torch.float64)
    ref = -torch.rand(3, 4, generator=g, dtype=torch.float64)
    scores = torch.zeros(3, 4, dtype=torch.float64)
    scores[0, 2], scores[1, 0] = 1.0, 0.5
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    ctrl = algorithms.AdaptiveKLController(0.2, target_kl=0.01, horizon=30)
    rewards, metrics = algorithms.apply_kl_penalty(scores, old, ref, mask, ctrl, kind="kl")
    per_row = []
    for i in range(3):
        kls = [float(old[i, t] - ref[i, t]) for t in range(4) if mask[i, t]]
        per_row.append(sum(kls) / len(kls) if kls else 0.0)
        for t in range(4):
            expected = float(scores[i, t]) - (0.2 * float(old[i, t] - ref[i, t]) if mask[i, t] else 0.0)
            assert rewards[i, t].item() == pytest.approx(expected)
    current = sum(per_row) / 3
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(current)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.2
    error = min(max(current / 0.01 - 1, -0.2), 0.2)
    assert ctrl.value == pytest.approx(0.2 * (1 + error * 3 / 30))


# ----------------------------------------------------------------------------------- value loss
@pytest.mark.parametrize("mode", algorithms.LOSS_AGG_MODES)
def test_value_loss_matches_loop(mode):
    g = torch.Generator().manual_seed(1)
    vpreds = torch.randn(4, 5, generator=g, dtype=torch.float64).requires_grad_()
    values = vpreds.detach() + torch.randn(4, 5, generator=g, dtype=torch.float64) * 0.5
    returns = torch.randn(4, 5, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [0] * 5, [1] * 5])
    loss, metrics = algorithms.value_loss(
        vpreds, returns, values, mask, cliprange_value=0.2, loss_agg_mode=mode
    )
    rows, clipped, n = [], 0, 0
    for i in range(4):
        row = []
        for t in range(5):
            if not mask[i, t]:
                continue
            v, v_old, ret = vpreds[i, t], float(values[i, t]), float(returns[i, t])
            vc = torch.clamp(v, v_old - 0.2, v_old + 0.2)
            row.append(torch.maximum((v - ret) ** 2, (vc - ret) ** 2))
            clipped += float((vc.detach() - ret) ** 2) > float((v.detach() - ret) ** 2)
            n += 1
        rows.append(row)
    seqs = [r for r in rows if r]
    if mode == "token-mean":
        ref = sum(x for r in seqs for x in r) / n
    elif mode == "seq-mean-token-sum":
        ref = sum(sum(r) for r in seqs) / len(seqs)
    elif mode == "seq-mean-token-mean":
        ref = sum(sum(r) / len(r) for r in seqs) / len(seqs)
    else:
        ref = sum(sum(r) for r in seqs) / (len(seqs) * 5)
    ref = 0.5 * ref
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(torch.autograd.grad(loss, vpreds)[0], torch.autograd.grad(ref, vpreds)[0])
    assert metrics["critic/vf_clipfrac"] == pytest.approx(clipped / n)
    assert metrics["critic/vf_loss"] == pytest.approx(loss.item())


def test_value_loss_hand_worked_and_unclipped():
    vpreds = torch.tensor([[2.0]], dtype=torch.float64)
    values, returns = torch.tensor([[1.0]], dtype=torch.float64), torch.tensor([[3.0]], dtype=torch.float64)
    # clipped prediction 1.5 is further from the return (1.5^2 > 1^2): the clipped term wins.
    loss, m = algorithms.value_loss(vpreds, returns, values, torch.ones(1, 1), cliprange_value=0.5)
    assert loss.item() == pytest.approx(0.5 * 2.25) and m["critic/vf_clipfrac"] == 1.0
    loss, m = algorithms.value_loss(vpreds, returns, values, torch.ones(1, 1), cliprange_value=None)
    assert loss.item() == pytest.approx(0.5) and m["critic/vf_clipfrac"] == 0.0


# ----------------------------------------------------------------------------------- entropy
def test_entropy_from_logits_matches_loop():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 3, 7, generator=g, dtype=torch.float64) * 3
    logits[0, 0] += 1e4  # large logits must not overflow
    out = algorithms.entropy_from_logits(logits)
    for i in range(2):
        for t in range(3):
            zs = [float(z) for z in logits[i, t]]
            top = max(zs)
            ps = [math.exp(z - top) for z in zs]
            total = sum(ps)
            h = -sum(p / total * math.log(p / total) for p in ps if p > 0)
            # H = logsumexp(z) - E[z] subtracts two numbers of size max|z|: a few float64 ulps of max|z|
            # (about 2e-12 at the 1e4 row; the exact digits depend on the CPU's vector kernels).
            tol = 8 * torch.finfo(torch.float64).eps * max(1.0, max(abs(z) for z in zs))
            assert out[i, t].item() == pytest.approx(h, abs=tol)
    bf = algorithms.entropy_from_logits(logits[1:].bfloat16())
    assert bf.dtype == torch.float32
    torch.testing.assert_close(
        bf.double(), algorithms.entropy_from_logits(logits[1:].bfloat16().double()), rtol=1e-5, atol=1e-6
    )


def test_entropy_loss_aggregates():
    entropy = torch.tensor([[1.0, 3.0], [2.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    assert algorithms.entropy_loss(entropy, mask).item() == pytest.approx(2.0)
    assert algorithms.entropy_loss(entropy, mask, "seq-mean-token-mean").item() == pytest.approx(2.0)
    assert algorithms.entropy_loss(entropy, mask, "token-mean", global_tokens=6).item() == pytest.approx(1.0)

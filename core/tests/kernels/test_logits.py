"""rlcore's fused log-prob head (:mod:`rlcore.kernels.logits`, the FSDP engine's and the Megatron engine's at
TP=1) against plain float64 references: :func:`rlcore.kernels.logits.linear_log_probs` values and gradients
(hidden, weight, bias) against ``log_softmax`` of the full logits, for chunk sizes that do and do not
divide the token count, with a temperature, with only one of the two outputs used, compiled and eager.
"""

import pytest
import torch
from rlcore.kernels.logits import _grad_logits, _grad_logits_functional, linear_log_probs

M, H, V = 23, 8, 31


def reference(hidden, weight, bias, targets, temperature):
    z = (hidden @ weight.T + (0 if bias is None else bias)) / temperature
    log_p = torch.log_softmax(z, dim=-1)
    return log_p.gather(-1, targets[:, None])[:, 0], -(log_p.exp() * log_p).sum(-1)


def leaves(with_bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(M, H, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(V, H, dtype=torch.float64, generator=g, requires_grad=True)
    bias = torch.randn(V, dtype=torch.float64, generator=g, requires_grad=True) if with_bias else None
    targets = torch.randint(0, V, (M,), generator=g)
    return hidden, weight, bias, targets


@pytest.mark.parametrize("chunk", [1, 5, M, 4 * M])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("keep_logits", [False, True])
def test_linear_log_probs_matches_full_log_softmax(chunk, temperature, with_bias, keep_logits):
    hidden, weight, bias, targets = leaves(with_bias)
    log_probs, entropy = linear_log_probs(
        hidden, weight, bias, targets, temperature, chunk, keep_logits=keep_logits
    )
    want_lp, want_ent = reference(hidden, weight, bias, targets, temperature)
    torch.testing.assert_close(log_probs, want_lp, rtol=0, atol=1e-12)
    torch.testing.assert_close(entropy, want_ent, rtol=0, atol=1e-12)

    g = torch.Generator().manual_seed(1)
    g_lp, g_ent = (
        torch.randn(M, dtype=torch.float64, generator=g),
        torch.randn(M, dtype=torch.float64, generator=g),
    )
    params = [t for t in (hidden, weight, bias) if t is not None]
    got = torch.autograd.grad((log_probs * g_lp + entropy * g_ent).sum(), params)
    want = torch.autograd.grad((want_lp * g_lp + want_ent * g_ent).sum(), params)
    for name, a, b in zip(("hidden", "weight", "bias")[: len(got)], got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11, msg=name)


@pytest.mark.parametrize("which", [0, 1])
def test_linear_log_probs_with_one_output_used(which):
    hidden, weight, _, targets = leaves(False, seed=3)
    got = linear_log_probs(hidden, weight, None, targets, 1.0, 7)[which].sum()
    want = reference(hidden, weight, None, targets, 1.0)[which].sum()
    for a, b in zip(
        torch.autograd.grad(got, [hidden, weight]), torch.autograd.grad(want, [hidden, weight]), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11)


def test_linear_log_probs_bf16_inputs_give_fp32_close_to_float64():
    hidden, weight, _, targets = leaves(False, seed=4)
    lp, ent = linear_log_probs(hidden.detach().bfloat16(), weight.detach().bfloat16(), None, targets, 1.0, 8)
    want_lp, want_ent = reference(hidden.detach(), weight.detach(), None, targets, 1.0)
    assert lp.dtype == ent.dtype == torch.float32
    # bf16 logits carry ~3 significant digits; the statistics are then computed in fp32.
    assert float((lp.double() - want_lp).abs().max()) < 0.3
    assert float((ent.double() - want_ent).abs().max()) < 0.3


def test_kept_logits_give_the_recomputed_gradients_in_bf16():
    """``fsdp.recompute_logits: false`` keeps the very logits the backward would recompute, so even
    in bf16 (where a different rounding would show) the gradients are identical."""
    hidden, weight, bias, targets = leaves(True, seed=6)
    grads = {}
    for keep in (False, True):
        h, w, b = (t.detach().bfloat16().requires_grad_() for t in (hidden, weight, bias))
        lp, ent = linear_log_probs(h, w, b, targets, 0.8, 6, keep_logits=keep)
        grads[keep] = torch.autograd.grad((lp - 0.5 * ent).sum(), [h, w, b])
    for a, b in zip(grads[False], grads[True], strict=True):
        assert torch.equal(a, b)


def test_linear_log_probs_empty_and_bad_chunk():
    hidden, weight, _, targets = leaves(False)
    lp, ent = linear_log_probs(hidden[:0], weight, None, targets[:0], 1.0, 4)
    assert lp.shape == ent.shape == (0,)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        linear_log_probs(hidden, weight, None, targets, 1.0, 0)


def test_compiled_head_matches_eager_and_float64():
    """``fsdp.compile``'s fused head computes the same values and gradients (float64, a temperature,
    a last chunk shorter than the others, logits kept from the forward)."""
    hidden, weight, bias, targets = leaves(True, seed=5)
    got = linear_log_probs(hidden, weight, bias, targets, 0.6, 10, compiled=True, keep_logits=True)
    want = reference(hidden, weight, bias, targets, 0.6)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    grads = torch.autograd.grad((got[0] + 0.3 * got[1]).sum(), [hidden, weight, bias])
    want_grads = torch.autograd.grad((want[0] + 0.3 * want[1]).sum(), [hidden, weight, bias])
    for a, b in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_both_gradient_forms_equal_autograd_in_float64(temperature):
    """The in-place gradient (eager) and the functional one (what ``fsdp.compile`` compiles) against
    autograd of ``g_lp * log_softmax[target] + g_ent * entropy`` through the logits, in float64."""
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(M, V, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(0, V, (M,), generator=g)
    g_lp, g_ent = torch.randn(2, M, dtype=torch.float64, generator=g)
    log_p = torch.log_softmax(logits / temperature, dim=-1)
    lp, ent = log_p.gather(-1, targets[:, None])[:, 0], -(log_p.exp() * log_p).sum(-1)
    (want,) = torch.autograd.grad((g_lp * lp + g_ent * ent).sum(), [logits])
    lse = torch.logsumexp(logits.detach() / temperature, dim=-1)
    args = (logits.detach(), targets, lse, ent.detach(), g_lp, g_ent, temperature)
    torch.testing.assert_close(_grad_logits(*args), want, rtol=0, atol=1e-12)
    torch.testing.assert_close(_grad_logits_functional(*args), want, rtol=0, atol=1e-12)

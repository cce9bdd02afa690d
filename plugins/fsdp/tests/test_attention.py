"""The FSDP engine's var-len attention (:func:`rlcore_fsdp.attention.varlen_attention`) against attention
written as a loop over query positions (each attends to its own sequence's earlier tokens), with grouped
key/value heads, eager and inside ``torch.compile``.
"""

import pytest
import torch
from rlcore_fsdp import attention
from rlcore_fsdp.attention import varlen_attention


def loop_attention(q, k, v, bounds, scale):
    out = torch.zeros_like(q)
    groups = q.shape[1] // k.shape[1]
    for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
        for i in range(start, stop):
            for head in range(q.shape[1]):
                keys, values = k[start : i + 1, head // groups], v[start : i + 1, head // groups]
                weights = torch.softmax(keys @ q[i, head] * scale, dim=0)
                out[i, head] = weights @ values
    return out


@pytest.mark.parametrize("lengths", [[7], [5, 9, 1, 3]])
def test_varlen_attention_stays_within_each_sequence(lengths):
    g = torch.Generator().manual_seed(0)
    n = sum(lengths)
    q = torch.randn(n, 4, 8, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(n, 2, 8, dtype=torch.float64, generator=g, requires_grad=True)
    v = torch.randn(n, 2, 8, dtype=torch.float64, generator=g, requires_grad=True)
    bounds = [0]
    for length in lengths:
        bounds.append(bounds[-1] + length)
    cu = torch.tensor(bounds, dtype=torch.int32)
    got = varlen_attention(q, k, v, cu, max(lengths), 0.3)
    want = loop_attention(q, k, v, bounds, 0.3)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    grads = torch.autograd.grad(got.square().sum(), [q, k, v])
    want_grads = torch.autograd.grad(want.square().sum(), [q, k, v])
    for a, b in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11)


# bf16 inputs carry ~3 significant digits: measured errors stay under a third of this tolerance.
@pytest.mark.parametrize("dtype, rtol, atol", [(torch.float64, 0, 1e-11), (torch.bfloat16, 0.02, 0.05)])
def test_compiled_varlen_attention_matches_loop(dtype, rtol, atol):
    """Inside ``torch.compile`` (as ``fsdp.compile`` runs it, in each decoder layer) the backend takes the
    path the device and dtype support, here the CPU's per-sequence SDPA, with compiled work on both sides.
    The kernel is probed on real tensors even when the first call comes while dynamo traces (with fake
    tensors the kernel would seem to run, then fail at run time). Two batches of different layouts;
    values and gradients, bf16 against the float64 reference."""
    attention._probe.cache_clear()  # decide while tracing, not from an earlier eager call

    @torch.compile(dynamic=True)
    def layer(q, k, v, cu, max_len):
        return 3 * varlen_attention(2 * q, k, v, cu, max_len, 0.15)  # (2q)·k * 0.15 = q·k * 0.3

    for seed, lengths in enumerate([[5, 9, 1, 3], [7, 6]]):
        g = torch.Generator().manual_seed(seed)
        n = sum(lengths)
        q, k, v = (torch.randn(n, h, 8, dtype=torch.float64, generator=g) for h in (4, 2, 2))
        bounds = [0]
        for length in lengths:
            bounds.append(bounds[-1] + length)
        leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        got = layer(*leaves, torch.tensor(bounds, dtype=torch.int32), max(lengths))
        want = 3 * loop_attention(*(t.requires_grad_() for t in (q, k, v)), bounds, 0.3)
        assert got.dtype == dtype
        torch.testing.assert_close(got.double(), want, rtol=rtol, atol=atol)
        cotangent = torch.randn(want.shape, dtype=torch.float64, generator=g)
        grads = torch.autograd.grad(got, leaves, cotangent.to(dtype))
        want_grads = torch.autograd.grad(want, [q, k, v], cotangent)
        for a, b in zip(grads, want_grads, strict=True):
            torch.testing.assert_close(a.double(), b, rtol=rtol, atol=atol)

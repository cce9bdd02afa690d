"""rlcore_megatron.optimizer: the device-side gradient norm and clip, and the switch to fused Adam, against
float64 references computed here in plain loops."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from rlcore_megatron import optimizer as opt
from torch.utils._python_dispatch import TorchDispatchMode


class _HostReads(TorchDispatchMode):
    """Counts reads of a tensor's value to the host (``item``, ``float``, ``bool``: a device sync on a GPU)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _grads(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen) for shape in [(7, 3), (5,), (4, 4, 2), (1,)]]


def test_l2_norm_is_the_float64_norm_and_never_reads_the_device():
    grads = _grads()
    expected = math.sqrt(sum(float(x) ** 2 for g in grads for x in g.double().flatten()))
    with _HostReads() as reads:
        norm, per_tensor = opt._l2_norm(2048 * 32, None, [grads], False)
    assert reads.count == 0
    assert per_tensor is None and norm.shape == (1,) and norm.dtype == torch.float32
    assert norm.item() == pytest.approx(expected, rel=1e-6)
    with _HostReads() as reads:  # the spy sees host reads when there are some
        float(norm)
    assert reads.count == 1


@pytest.mark.parametrize("in_place", [True, False])
def test_scale_by_tensor_scales_every_tensor_on_the_device(in_place):
    src = _grads(1)
    expected = [[float(x) * 0.25 for x in g.double().flatten()] for g in src]
    dst = src if in_place else [torch.zeros_like(g) for g in src]
    with _HostReads() as reads:
        opt._scale_by_tensor(2048 * 32, None, [src, dst], torch.tensor([0.25]))  # [1], as megatron-core
    assert reads.count == 0
    for d, e in zip(dst, expected, strict=True):
        assert d.flatten().tolist() == pytest.approx(e, rel=1e-7)


def test_install_replaces_only_megatrons_local_fallback(monkeypatch):
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads

    monkeypatch.setattr(clip_grads, "l2_norm_impl", utils.local_multi_tensor_l2_norm)
    if hasattr(clip_grads, "multi_tensor_scale_tensor_impl"):
        monkeypatch.setattr(clip_grads, "multi_tensor_scale_tensor_impl", None)
    assert opt.install_device_norm()
    assert clip_grads.l2_norm_impl is opt._l2_norm
    assert opt.install_device_norm()  # idempotent
    if hasattr(clip_grads, "multi_tensor_scale_tensor_impl"):
        assert clip_grads.multi_tensor_scale_tensor_impl is opt._scale_by_tensor

    def vendor_kernel(*args):  # what Transformer Engine or Apex would have put there
        raise AssertionError("not called")

    monkeypatch.setattr(clip_grads, "l2_norm_impl", vendor_kernel)
    assert not opt.install_device_norm()
    assert clip_grads.l2_norm_impl is vendor_kernel


def _adam_reference(params, grads, steps, lr, betas, eps, wd):
    """Decoupled-weight-decay Adam in float64, one element at a time."""
    out = []
    for p, g in zip(params, grads, strict=True):
        values = []
        for x, gx in zip(p.double().flatten().tolist(), g.double().flatten().tolist(), strict=True):
            m = v = 0.0
            for t in range(1, steps + 1):
                x -= lr * wd * x
                m = betas[0] * m + (1 - betas[0]) * gx
                v = betas[1] * v + (1 - betas[1]) * gx * gx
                m_hat, v_hat = m / (1 - betas[0] ** t), v / (1 - betas[1] ** t)
                x -= lr * m_hat / (math.sqrt(v_hat) + eps)
            values.append(x)
        out.append(values)
    return out


def test_fuse_adam_switches_to_the_fused_kernel_and_steps_as_adam():
    params = [torch.nn.Parameter(g.clone()) for g in _grads(2)]
    grads = _grads(3)
    hp = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    torch_opt = torch.optim.AdamW(params, **hp)
    megatron_like = SimpleNamespace(chained_optimizers=[SimpleNamespace(optimizer=torch_opt)])
    expected = _adam_reference(params, grads, 3, hp["lr"], hp["betas"], hp["eps"], hp["weight_decay"])
    assert opt.fuse_adam(megatron_like) == 1
    assert all(group["fused"] and not group["foreach"] for group in torch_opt.param_groups)
    for _ in range(3):
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        torch_opt.step()
    for p, e in zip(params, expected, strict=True):
        assert p.detach().flatten().tolist() == pytest.approx(e, abs=1e-6)
    with pytest.raises(RuntimeError, match="before the optimizer's first step"):
        opt.fuse_adam(megatron_like)


def test_fuse_adam_leaves_other_optimizers():
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    assert opt.fuse_adam(SimpleNamespace(optimizer=sgd)) == 0
    assert "fused" not in sgd.param_groups[0] or not sgd.param_groups[0]["fused"]

"""What the engine changes in megatron-core's optimizer when neither Transformer Engine nor Apex is installed.

megatron-core takes its multi-tensor kernels (gradient norm, clipping) and its fused Adam from Transformer
Engine or Apex. Without them (this project's setting: neither installs from the package index) it falls
back to code that costs a training step more than the arithmetic:

* **the gradient norm**: ``megatron.core.utils.local_multi_tensor_l2_norm`` builds a host tensor from the
  per-parameter norms (``torch.tensor(list of device scalars)``): one device sync per parameter tensor (170
  for a 0.5B Qwen in Megatron's fused layout) at the end of every step, the first waiting for the whole
  backward, then a host round trip each, and a host float at the end. :func:`install_device_norm` replaces it with two device kernels (``torch._foreach_norm``, then the
  norm of those norms) and, where megatron-core has the hook for it (0.19: ``multi_tensor_scale_tensor_impl``,
  which Transformer Engine fills), clips by a coefficient that stays on the device too, as it does with
  Transformer Engine: the optimizer step then never waits for the device.
* **Adam**: the fallback is ``torch.optim.AdamW`` with its default multi-tensor (``foreach``) form, about a
  dozen passes over the fp32 state. :func:`fuse_adam` switches it to PyTorch's fused kernel (one pass, what
  Apex's and Transformer Engine's ``FusedAdam`` are) wherever PyTorch has that kernel for every parameter's
  device and dtype.

Both leave megatron-core untouched when Transformer Engine or Apex provided the real kernels.
"""

from __future__ import annotations

import torch
from torch.utils._foreach_utils import _get_fused_kernels_supported_devices


def _l2_norm(chunk_size: int, noop_flag, tensor_lists: list[list[torch.Tensor]], per_tensor: bool, *args):
    """``amp_C.multi_tensor_l2norm``'s contract: the L2 norm of all of ``tensor_lists[0]`` as a
    ``[1]`` fp32 device tensor, and no per-tensor norms."""
    tensors = tensor_lists[0]
    norms = torch._foreach_norm(tensors, 2.0)
    return torch.linalg.vector_norm(torch.stack([n.float() for n in norms])).reshape(1), None


def _scale_by_tensor(chunk_size: int, noop_flag, tensor_lists: list[list[torch.Tensor]], scale: torch.Tensor):
    """``multi_tensor_scale_tensor``'s contract: ``tensor_lists[1][i] = tensor_lists[0][i] * scale`` with
    ``scale`` a one-element device tensor (``[1]`` from megatron-core; the same list twice: in place)."""
    src, dst = tensor_lists
    scale = scale.reshape(())  # the foreach ops take a tensor scalar as a 0-dim tensor
    if all(s is d for s, d in zip(src, dst, strict=True)):
        torch._foreach_mul_(dst, scale)
    else:
        torch._foreach_copy_(dst, torch._foreach_mul(src, scale))


def install_device_norm() -> bool:
    """Put :func:`_l2_norm` (and :func:`_scale_by_tensor` where the hook exists) into megatron-core's
    gradient clipping if it is on its local fallback. Returns whether it did; idempotent."""
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads

    if clip_grads.l2_norm_impl not in (utils.local_multi_tensor_l2_norm, _l2_norm):
        return False  # Transformer Engine's or Apex's kernels
    clip_grads.l2_norm_impl = _l2_norm
    if hasattr(clip_grads, "multi_tensor_scale_tensor_impl"):
        clip_grads.multi_tensor_scale_tensor_impl = _scale_by_tensor
    return True


def torch_adams(optimizer) -> list:
    """The ``torch.optim.Adam(W)`` inside each of Megatron's (chained) optimizers, or None where
    Megatron uses a fused Adam (Apex / Transformer Engine), which keeps its step in param groups."""
    out = []
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        torch_opt = getattr(inner, "optimizer", None)
        out.append(torch_opt if isinstance(torch_opt, torch.optim.Adam | torch.optim.AdamW) else None)
    return out


def fuse_adam(optimizer) -> int:
    """Switch every ``torch.optim.Adam``/``AdamW`` inside megatron-core's ``optimizer`` (chained or not)
    to PyTorch's fused kernel where all of its parameters are on a device that has it. Returns how many
    it switched. Call before the first step (the fused form keeps ``step`` on the device from its first
    step on)."""
    supported = set(_get_fused_kernels_supported_devices())
    switched = 0
    for torch_opt in torch_adams(optimizer):
        if torch_opt is None:
            continue
        params = [p for group in torch_opt.param_groups for p in group["params"]]
        if any(torch_opt.state.get(p) for p in params):
            raise RuntimeError("fuse_adam must run before the optimizer's first step")
        if not params or any(p.device.type not in supported or not p.is_floating_point() for p in params):
            continue
        for group in torch_opt.param_groups:
            group["fused"], group["foreach"] = True, False
        torch_opt.defaults.update(fused=True, foreach=False)
        switched += 1
    return switched

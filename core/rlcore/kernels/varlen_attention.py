"""Causal attention within each of several sequences packed into one row: the var-len kernel both train
engines share (``rlcore_fsdp.attention`` registers it with transformers; ``rlcore_megatron.attention`` puts it
in megatron-core's layer spec).

A packed micro-batch holds ``n`` sequences back to back, ``N`` tokens in all; ``cu_seq_lens [n+1]`` (int32,
on the device) marks where each starts. Attention stays inside each sequence and is causal there, so the
work is ``sum_s L_s**2`` instead of the ``N**2`` a block-diagonal mask costs.

Kernel: ``torch.nn.attention.varlen.varlen_attn`` (PyTorch's flash-attention var-len op), used wherever
the tensors' device and dtype support it. Elsewhere (the CPU, fp32 anywhere) the same result comes from
one causal SDPA call per sequence: exact, and cheap for the short sequences small runs have. Which one a
``(device type, dtype)`` gets is found by probing the kernel once on tiny real tensors of that device and
dtype (so no device is named here), never traced, and the answer is a constant to ``torch.compile``: so a
compiled decoder layer takes the same decision as an eager one. (Trying the kernel on the real inputs
would not do under compile: dynamo traces the call with fake tensors, which every device accepts, and the
compiled code then fails at run time.)
"""

from __future__ import annotations

import functools
import inspect
import math

import torch
import torch.nn.functional as F


@functools.cache
def _kernel():
    """``(varlen_attn, its parameter names)``, or None before torch 2.9 (looked up once: this runs per
    layer and micro-batch)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


def _kernel_call(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int, scale: float
) -> torch.Tensor:
    """``q [N, Hq, D]``, ``k``/``v [N, Hkv, D]`` -> ``[N, Hq, D]`` through ``varlen_attn``, whose signature
    changed between torch releases (``is_causal`` then ``window_size``; ``scale`` and ``enable_gqa`` later)."""
    kernel, params = _kernel()
    kwargs = {}
    if "window_size" in params:
        kwargs["window_size"] = (-1, 0)  # causal
    else:
        kwargs["is_causal"] = True
    if "scale" in params:
        kwargs["scale"] = scale
    elif not math.isclose(scale, q.shape[-1] ** -0.5):
        q = q * (scale * q.shape[-1] ** 0.5)  # the kernel's fixed 1/sqrt(D), corrected on q
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    return kernel(q, k, v, cu, cu, max_len, max_len, **kwargs)


@functools.cache
def _probe(device_type: str, dtype: torch.dtype) -> bool:
    """Whether :func:`_kernel_call` runs on ``device_type`` in ``dtype``: one call on 2 tokens, 1 head,
    head dim 8 (``[2, 1, 8]``), whose failure (no flash kernel for the CPU, fp32 or this GPU) means no."""
    if _kernel() is None:
        return False
    x = torch.zeros(2, 1, 8, device=device_type, dtype=dtype)
    cu = torch.tensor([0, 1, 2], device=device_type, dtype=torch.int32)
    try:
        with torch.no_grad():
            _kernel_call(x, x, x, cu, 1, 8**-0.5)
    except (RuntimeError, NotImplementedError):
        return False
    return True


@torch.compiler.assume_constant_result
def _kernel_runs(device_type: str, dtype: torch.dtype) -> bool:
    """:func:`_probe`, which dynamo calls while tracing and keeps as a constant: it must not trace the
    probe (fake tensors would let the kernel "run" on any device). A plain function around the cached
    one, because dynamo traces through a ``functools.cache`` wrapper to the function it wraps."""
    return _probe(device_type, dtype)


# Eager even inside a compiled layer: traced, the loop over ``cu.tolist()`` would specialise the graph
# on the number of sequences and their lengths, recompiling for nearly every micro-batch (measured on
# the CPU: 20-30 s per new batch layout for this function alone, then eager anyway once dynamo's
# recompile limit is hit). Disabled, it is one graph break with nothing to specialise.
@torch.compiler.disable
def _per_sequence(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, scale: float
) -> torch.Tensor:
    """The same as :func:`_kernel_call`, one causal SDPA per sequence (``[1, H, L, D]`` each); ``cu`` is
    read on the host (pass a host copy to spare the device a sync)."""
    bounds = cu.tolist()
    groups = q.shape[1] // k.shape[1]
    out = []
    for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
        qs, ks, vs = (t[start:stop].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        if groups > 1:
            ks, vs = ks.repeat_interleave(groups, dim=1), vs.repeat_interleave(groups, dim=1)
        out.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale)[0].transpose(0, 1))
    return torch.cat(out)


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    max_len: int,
    scale: float,
    host_bounds: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention within each packed sequence: ``q [N, Hq, D]``, ``k``/``v [N, Hkv, D]`` (``Hq`` a
    multiple of ``Hkv``), ``cu_seq_lens [n+1]`` int32 starting at 0 and ending at ``N`` -> ``[N, Hq, D]``.
    ``host_bounds``: the same boundaries on the host, if the caller has them (the per-sequence fallback
    reads them there instead of syncing with the device)."""
    if _kernel_runs(q.device.type, q.dtype):
        return _kernel_call(q, k, v, cu_seq_lens, max_len, scale)  # an error here is a real one
    return _per_sequence(q, k, v, cu_seq_lens if host_bounds is None else host_bounds, scale)

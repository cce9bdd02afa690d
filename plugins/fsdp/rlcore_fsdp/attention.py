"""Padding-free attention over packed sequences: the ``varlen`` backend of ``fsdp.attn_implementation``.

A packed micro-batch is one row ``[1, N]`` holding ``n`` sequences back to back; ``cu_seq_lens [n+1]``
(int32, on the device) marks where each starts. Attention must stay inside each sequence and be causal
there, so the work is ``sum_s L_s**2`` instead of the ``N**2`` a block-diagonal mask costs SDPA (which is
what Hugging Face's ``sdpa`` backend does with packed ``position_ids``; at 16k-token micro-batches that
mask alone is 256M entries per layer).

The kernel (PyTorch's flash var-len op where the device and dtype have it, one causal SDPA per sequence
elsewhere) lives in :mod:`rlcore.kernels.varlen_attention`, shared with the megatron engine.

The backend registers with transformers' ``AttentionInterface`` as :data:`ATTN_NAME`; being unknown to
``transformers.masking_utils``, it gets no mask (``attention_mask`` is None), so it only runs on packed
inputs, with the ``cu_seq_lens_q``/``max_length_q`` keyword arguments that
:class:`rlcore_fsdp.model.HeadedModel` passes down.
"""

from __future__ import annotations

import torch
from rlcore.kernels.varlen_attention import _probe, varlen_attention

__all__ = ["ATTN_NAME", "register", "varlen_attention", "varlen_attention_forward", "_probe"]

#: The name the backend is registered under in transformers (what the model is loaded with).
ATTN_NAME = "rlcore_varlen"


def register() -> str:
    """Register the backend with transformers (idempotent); returns the name to load models with."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, varlen_attention_forward)
    return ATTN_NAME


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    max_length_q: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: ``query [1, Hq, N, D]``, ``key``/``value [1, Hkv, N, D]`` ->
    ``([1, N, Hq, D], None)``."""
    if cu_seq_lens_q is None or query.shape[0] != 1:
        raise ValueError(
            f"attn_implementation {ATTN_NAME!r} runs only on packed inputs ([1, N] with cu_seq_lens_q); "
            "set fsdp.use_remove_padding=true with fsdp.attn_implementation=varlen"
        )
    if sliding_window is not None:
        raise ValueError(
            f"attn_implementation {ATTN_NAME!r} does not implement sliding-window attention "
            f"({type(module).__name__} has sliding_window={sliding_window}); use fsdp.attn_implementation=sdpa"
        )
    if dropout:
        raise ValueError(f"attn_implementation {ATTN_NAME!r} has no attention dropout (got {dropout})")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))  # [N, H, D]
    out = varlen_attention(q, k, v, cu_seq_lens_q, int(max_length_q), scale)
    return out.unsqueeze(0), None

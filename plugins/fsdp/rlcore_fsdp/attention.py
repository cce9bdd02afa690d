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

With sequence parallelism (``fsdp.sequence_parallel_size``) the model also passes :data:`SP_KWARG`: the
layer's q/k/v then hold this rank's slice of the row, and attention runs on the whole row for a share of
the heads between two all-to-alls (:mod:`rlcore_fsdp.sequence_parallel`).
"""

from __future__ import annotations

import torch
from rlcore.kernels.varlen_attention import _probe, varlen_attention

from rlcore_fsdp.sequence_parallel import SequenceParallel, heads_to_seq, seq_to_heads

__all__ = ["ATTN_NAME", "SP_KWARG", "register", "varlen_attention", "varlen_attention_forward", "_probe"]

#: The name the backend is registered under in transformers (what the model is loaded with).
ATTN_NAME = "rlcore_varlen"
#: The keyword argument that carries the :class:`SequenceParallel` group through the HF model's layers
#: (transformers hands a model's extra keyword arguments down to its attention function).
SP_KWARG = "rlcore_sequence_parallel"


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
    rlcore_sequence_parallel: SequenceParallel | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: ``query [1, Hq, N, D]``, ``key``/``value [1, Hkv, N, D]`` ->
    ``([1, N, Hq, D], None)``. With ``rlcore_sequence_parallel`` (:data:`SP_KWARG`) the ``N`` tokens are
    this rank's slice of the row that ``cu_seq_lens_q`` describes."""
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
    sp = rlcore_sequence_parallel
    if sp is None or sp.size == 1:
        out = varlen_attention(q, k, v, cu_seq_lens_q, int(max_length_q), scale)
        return out.unsqueeze(0), None
    if k.shape[1] < sp.size:
        # Fewer key/value heads than ranks: repeat each so every rank gets one (check_heads made sure the
        # repeats line up with the query heads' groups).
        repeats = sp.size // k.shape[1]
        k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
    q, k, v = (seq_to_heads(t, sp) for t in (q, k, v))  # [sp*N, H/sp, D]: the whole row, some heads
    out = varlen_attention(q, k, v, cu_seq_lens_q, int(max_length_q), scale)
    return heads_to_seq(out, sp).unsqueeze(0), None

"""Core attention over packed sequences for megatron-core's local layer spec (``megatron.use_remove_padding``).

With packing, a micro-batch's sequences sit back to back in one row, padding removed: ``input_ids [1, N]``
and megatron-core's ``PackedSeqParams`` in its ``thd`` format (``cu_seqlens_q``, ``max_seqlen_q``). Given
those, megatron-core's ``SelfAttention`` drops the batch dimension (``query [N, heads, head_dim]``) and
applies rotary embeddings per sequence, from position 0 at each sequence's start; what it cannot do without
Transformer Engine is the attention itself (its local ``DotProductAttention`` refuses packed input). This
module does it: causal attention within each sequence, through :func:`rlcore.varlen_attention.varlen_attention`
(PyTorch's flash var-len kernel where the device and dtype have it, one SDPA call per sequence elsewhere).
Unpacked input (``packed_seq_params`` None) goes to megatron-core's own implementation unchanged.
"""

from __future__ import annotations

import torch
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.dot_product_attention import DotProductAttention
from rlcore.varlen_attention import varlen_attention


class PackedDotProductAttention(DotProductAttention):
    """megatron-core's ``DotProductAttention`` that also takes ``thd`` packed input."""

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type=None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: PackedSeqParams | None = None,
    ) -> torch.Tensor:
        """``query [N, heads/tp, d]``, ``key``/``value [N, groups/tp, d]`` -> ``[N, heads/tp * d]``
        when packed; megatron-core's ``[s, b, h]`` path otherwise."""
        if packed_seq_params is None:
            return super().forward(
                query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params
            )
        if packed_seq_params.qkv_format != "thd":
            raise ValueError(f"packed attention takes the thd format, got {packed_seq_params.qkv_format!r}")
        if attention_bias is not None or attention_mask is not None:
            raise ValueError("packed attention is causal within each sequence; it takes no mask or bias")
        if self.training and self.attention_dropout.p > 0:
            raise ValueError("packed attention has no attention dropout (attention_dropout must be 0)")
        if self.softmax_offset is not None or self.scale_mask_softmax.window_size is not None:
            raise ValueError("packed attention implements neither softmax offsets nor sliding windows")
        cu = packed_seq_params.cu_seqlens_q
        query, key, value = (t.contiguous() for t in (query, key, value))  # views of the fused QKV
        out = varlen_attention(
            query,
            key,
            value,
            cu,
            int(packed_seq_params.max_seqlen_q),
            float(self.softmax_scale),
            host_bounds=packed_seq_params.cu_seqlens_q_padded,  # the engine's host copy of ``cu``
        )
        return out.reshape(out.shape[0], self.hidden_size_per_partition)

"""Core attention over packed sequences for megatron-core's local layer spec (``megatron.use_remove_padding``).

With packing, a micro-batch's sequences sit back to back in one row, padding removed: ``input_ids [1, N]``
and megatron-core's ``PackedSeqParams`` in its ``thd`` format (``cu_seqlens_q``, ``max_seqlen_q``). Given
those, megatron-core's ``SelfAttention`` drops the batch dimension (``query [N, heads, head_dim]``); what it
cannot do without Transformer Engine is the attention itself (its local ``DotProductAttention`` refuses
packed input). This module does it: causal attention within each sequence, through
:func:`rlcore.kernels.varlen_attention.varlen_attention` (PyTorch's flash var-len kernel where the device and dtype
have it, one SDPA call per sequence elsewhere).

It also applies the rotary embedding. megatron-core's own ``thd`` rotary path loops over the sequences of
the pack in Python, for queries and keys of every layer (and reads each sequence's offset with ``.item()``
in 0.19): measured on an H200, about 100 host operations per sequence and layer left the device idle 83%
of a 0.5B model's training step. A packed model is therefore built without megatron-core's rotary
embedding (``position_embedding_type="none"``, :func:`rlcore_megatron.model.build_stage_model`); the engine
computes each token's rotary cosines and sines once per micro-batch (:class:`PackedRotary`, from
megatron-core's own ``RotaryEmbedding`` table indexed by the token's position within its sequence) and
they reach every layer in :class:`PackedSequences`, where the whole pack is rotated at once, inside the
compiled layer with ``megatron.compile``. Unpacked input (``packed_seq_params`` None) goes to megatron-core's own
implementation unchanged.
"""

from __future__ import annotations

import dataclasses

import torch
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.dot_product_attention import DotProductAttention
from rlcore.kernels.varlen_attention import varlen_attention


@dataclasses.dataclass
class PackedSequences(PackedSeqParams):
    """megatron-core's ``thd`` parameters and what :class:`PackedDotProductAttention` needs beside them:
    ``rotary_cos``, ``rotary_sin [N, 1, head_dim]`` (each packed token's rotary cosines and sines, in the
    activations' dtype) and ``cu_seqlens_host`` (``cu_seqlens_q`` on the host: the per-sequence attention
    fallback reads it without a device sync)."""

    rotary_cos: torch.Tensor | None = None
    rotary_sin: torch.Tensor | None = None
    cu_seqlens_host: torch.Tensor | None = None


class PackedRotary:
    """Rotary cosines and sines of packed tokens: ``(position_ids [N], max_len, dtype) -> (cos, sin)``, each
    ``[N, 1, head_dim]`` in ``dtype``, from the angle table of megatron-core's ``RotaryEmbedding`` built as
    ``GPTModel`` builds it (base, llama-3 scaling). Once per micro-batch for all layers, as HF computes
    them once per forward: computed in every layer instead, from fp32 angles, they were 44 ms of a 0.5B
    step's kernels on an H200 against FSDP's 27 ms for the whole rotation."""

    def __init__(self, config: TransformerConfig, rotary_base: float, rope_scaling_factor: float | None):
        if config.rotary_interleaved or config.multi_latent_attention:
            raise ValueError("packed attention rotates halves (HF's layout), not interleaved or MLA rotary")
        self.embedding = RotaryEmbedding(
            kv_channels=config.kv_channels,
            rotary_percent=1.0,
            rotary_interleaved=config.rotary_interleaved,
            rotary_base=rotary_base,
            rope_scaling=rope_scaling_factor is not None,
            rope_scaling_factor=rope_scaling_factor or 8.0,
            use_cpu_initialization=config.use_cpu_initialization,
        )

    def __call__(
        self, position_ids: torch.Tensor, max_len: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        table = self.embedding(max_len)  # fp32 angles [max_len, 1, 1, head_dim] on the current device
        angles = table[position_ids.to(table.device)].squeeze(1)  # [N, 1, head_dim]: broadcast over heads
        # Rounded to the activations' dtype after the fp32 cos/sin, as megatron-core and HF both do.
        return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``t [N, heads, d]`` by per-token ``cos``, ``sin [N, 1, d]``: the rotate-half form
    of megatron-core's unfused ``bshd`` rotary and of HF's ``apply_rotary_pos_emb``. Written here because
    megatron-core's dispatcher asks ``parallel_state`` for the context-parallel group, which dynamo cannot
    trace, and the private function behind it changed its signature between 0.16 and 0.19."""
    first, second = t.chunk(2, dim=-1)
    return t * cos + torch.cat((-second, first), dim=-1) * sin


class PackedDotProductAttention(DotProductAttention):
    """megatron-core's ``DotProductAttention`` that also takes ``thd`` packed input (rotary applied here)."""

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
        when packed; megatron-core's ``[s, b, h]`` path otherwise.

        Traced by ``torch.compile`` inside a compiled layer (``megatron.compile``), so the rotation's
        elementwise work fuses with the projections around it and the var-len kernel is a node of the
        layer's graph, as in the FSDP engine's compiled layers (``rlcore_megatron.compiled`` says what else
        kept the layer from being one graph; with both fixed, 1.8x the eager engine's tokens/s at 0.5B on an
        H200, ``docs/benchmarks.md``)."""
        if packed_seq_params is None:
            return self._unpacked(query, key, value, attention_mask, attn_mask_type, attention_bias)
        if not isinstance(packed_seq_params, PackedSequences) or packed_seq_params.rotary_cos is None:
            raise ValueError("packed attention takes PackedSequences with the rotary cos/sin of the pack")
        if packed_seq_params.qkv_format != "thd":
            raise ValueError(f"packed attention takes the thd format, got {packed_seq_params.qkv_format!r}")
        if attention_bias is not None or attention_mask is not None:
            raise ValueError("packed attention is causal within each sequence; it takes no mask or bias")
        if self.training and self.attention_dropout.p > 0:
            raise ValueError("packed attention has no attention dropout (attention_dropout must be 0)")
        if self.softmax_offset is not None or self.scale_mask_softmax.window_size is not None:
            raise ValueError("packed attention implements neither softmax offsets nor sliding windows")
        cos, sin = packed_seq_params.rotary_cos, packed_seq_params.rotary_sin
        query, key = (_rotate(t, cos, sin) for t in (query, key))
        value = value.contiguous()  # a view of the fused QKV projection
        out = varlen_attention(
            query,
            key,
            value,
            packed_seq_params.cu_seqlens_q,
            packed_seq_params.max_seqlen_q,
            self.softmax_scale,
            host_bounds=packed_seq_params.cu_seqlens_host,
        )
        return out.reshape(out.shape[0], self.hidden_size_per_partition)

    # Unpacked input does not reach this class in practice (it is in the layer spec only with
    # ``megatron.use_remove_padding``, which packs every micro-batch); if it does, megatron-core's own
    # attention runs it eagerly, as the whole class ran before it was traced.
    @torch.compiler.disable
    def _unpacked(self, query, key, value, attention_mask, attn_mask_type, attention_bias):
        return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias, None)

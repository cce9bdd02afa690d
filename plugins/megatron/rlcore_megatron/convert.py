"""Hugging Face <-> megatron-core parameter mapping: names, fused layouts and tensor-parallel shards.

Pure tensor functions (no process groups), so the layouts are testable on their own.

Megatron fuses what HF keeps apart:

* ``linear_qkv`` interleaves per query group: for each of the ``G`` key/value groups, the group's
  ``H/G`` query heads, then its key head, then its value head, each ``d`` rows::

      [q(g0,h0) .. q(g0,h_{H/G-1}) | k(g0) | v(g0) | q(g1,h0) .. | k(g1) | v(g1) | ...]   rows: G*(H/G+2)*d

  Tensor parallelism cuts it into contiguous row blocks of ``G/tp`` whole groups.
* ``linear_fc1`` stacks ``[gate; up]`` (``2F`` rows), but each tensor-parallel rank holds
  ``[gate_r; up_r]``, so the full tensor is not the concatenation of the shards.
* The vocabulary is padded with zero rows to ``padded_vocab_size`` (a multiple of the TP size).
* A mixture of experts: each expert is a SwiGLU MLP with its own ``linear_fc1`` (``[gate; up]`` as above)
  and ``linear_fc2``, named ``mlp.experts.local_experts.<e>``; HF checkpoints keep each expert's
  projections apart (``mlp.experts.<e>.gate_proj`` ...; Mixtral ``block_sparse_moe.experts.<e>.w1``
  ...), and the router is HF's ``gate``. Expert parallelism gives each rank a contiguous block of
  experts, numbered from 0 locally: maps use global expert numbers, translated by the caller.

A :class:`ParamMap` names one Megatron parameter with *global* layer numbers; local parameter names on
a pipeline stage are translated with the stage's layer offset by the caller.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from rlcore_megatron.architecture import ModelShape

#: Owner of parameters outside the decoder layers.
FIRST, LAST = "first", "last"


@attrs.frozen
class ParamMap:
    """One Megatron parameter and the HF tensors it is made of.

    ``kind``: ``copy`` (same tensor), ``vocab`` (rows padded to the padded vocabulary), ``qkv`` or
    ``gate_up`` (fused, see the module docstring), ``stack`` (the HF tensors stacked along the rows, not
    split over tensor-parallel ranks: a fused LoRA layer's ``A``, :mod:`rlcore_megatron.lora`). ``tp_dim``: the dimension split over
    tensor-parallel ranks, None where every rank holds all of it. ``owner``: :data:`FIRST`,
    :data:`LAST` or a global layer index, which decides the pipeline stage. ``aliases``: more HF names
    exported with the same tensor (``lm_head.weight`` of tied embeddings). ``export``: False for
    Megatron's copy of a tied weight, exported through the embedding. ``optional``: may be absent from
    an HF checkpoint (a fresh value head).
    """

    mcore: str
    hf: tuple[str, ...]
    kind: str
    tp_dim: int | None
    owner: str | int
    aliases: tuple[str, ...] = ()
    export: bool = True
    optional: bool = False
    expert: int | None = None


def _mlp_maps(shape: ModelShape, i: int, mlp_norm: str) -> list[ParamMap]:
    """Layer ``i``'s MLP: one SwiGLU, or a router and ``num_experts`` of them."""
    m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
    if shape.experts is None:
        return [
            ParamMap(m + mlp_norm, (h + "post_attention_layernorm.weight",), "copy", None, i),
            ParamMap(
                m + "mlp.linear_fc1.weight",
                (h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"),
                "gate_up",
                0,
                i,
            ),
            ParamMap(m + "mlp.linear_fc2.weight", (h + "mlp.down_proj.weight",), "copy", 1, i),
        ]
    block = f"{h}{shape.moe_block}."
    gate, up, down = shape.expert_projections
    maps = [
        ParamMap(m + "pre_mlp_layernorm.weight", (h + "post_attention_layernorm.weight",), "copy", None, i),
        ParamMap(m + "mlp.router.weight", (block + "gate.weight",), "copy", None, i),
    ]
    for e in range(shape.experts.num_experts):
        mine, theirs = f"{m}mlp.experts.local_experts.{e}.", f"{block}experts.{e}."
        fc1 = (f"{theirs}{gate}.weight", f"{theirs}{up}.weight")
        maps.append(ParamMap(mine + "linear_fc1.weight", fc1, "gate_up", 0, i, expert=e))
        maps.append(ParamMap(mine + "linear_fc2.weight", (f"{theirs}{down}.weight",), "copy", 1, i, expert=e))
    return maps


def param_maps(shape: ModelShape, *, head: str = "lm", fused_norms: bool = False) -> list[ParamMap]:
    """Every parameter of the model in HF order. ``head``: ``lm``, or a scalar head exported as HF's
    ``score`` (``value``: with a bias, as ``...ForTokenClassification``; ``score``: without, as
    ``...ForSequenceClassification``). ``fused_norms``: Transformer Engine layers, whose
    norms live inside the following linear layer."""
    tied = shape.tie_word_embeddings and head == "lm"
    maps = [
        ParamMap(
            "embedding.word_embeddings.weight",
            ("model.embed_tokens.weight",),
            "vocab",
            0,
            FIRST,
            aliases=("lm_head.weight",) if tied else (),
        )
    ]
    input_norm = "self_attention.linear_qkv.layer_norm_weight" if fused_norms else "input_layernorm.weight"
    mlp_norm = "mlp.linear_fc1.layer_norm_weight" if fused_norms else "pre_mlp_layernorm.weight"
    for i in range(shape.num_layers):
        m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        maps.append(ParamMap(m + input_norm, (h + "input_layernorm.weight",), "copy", None, i))
        for suffix in ("weight", "bias") if shape.qkv_bias else ("weight",):
            hf = tuple(f"{h}self_attn.{p}_proj.{suffix}" for p in "qkv")
            maps.append(ParamMap(f"{m}self_attention.linear_qkv.{suffix}", hf, "qkv", 0, i))
        maps.append(
            ParamMap(m + "self_attention.linear_proj.weight", (h + "self_attn.o_proj.weight",), "copy", 1, i)
        )
        if shape.qk_norm:  # one RMSNorm weight [head_dim] per projection, shared by every head
            for p in "qk":
                maps.append(
                    ParamMap(
                        f"{m}self_attention.{p}_layernorm.weight",
                        (f"{h}self_attn.{p}_norm.weight",),
                        "copy",
                        None,
                        i,
                    )
                )
        maps.extend(_mlp_maps(shape, i, mlp_norm))
    maps.append(ParamMap("decoder.final_layernorm.weight", ("model.norm.weight",), "copy", None, LAST))
    if head != "lm":
        maps.append(ParamMap("output_layer.weight", ("score.weight",), "copy", None, LAST, optional=True))
        if head == "value":
            maps.append(ParamMap("output_layer.bias", ("score.bias",), "copy", None, LAST, optional=True))
    elif tied:
        # Megatron keeps a copy of the tied weight on the last stage when it is not the first.
        maps.append(
            ParamMap("output_layer.weight", ("model.embed_tokens.weight",), "vocab", 0, LAST, export=False)
        )
    else:
        maps.append(ParamMap("output_layer.weight", ("lm_head.weight",), "vocab", 0, LAST))
    return maps


def to_mcore(pm: ParamMap, hf_tensors: Sequence[torch.Tensor], shape: ModelShape) -> torch.Tensor:
    """The full (unsharded) Megatron tensor built from the HF tensors named by ``pm.hf``."""
    if len(hf_tensors) != len(pm.hf):
        raise ValueError(f"{pm.mcore} needs {len(pm.hf)} HF tensors {pm.hf}, got {len(hf_tensors)}")
    if pm.kind == "copy":
        return hf_tensors[0]
    if pm.kind == "vocab":
        weight = hf_tensors[0]
        if weight.shape[0] != shape.vocab_size:
            raise ValueError(
                f"{pm.hf[0]} has {weight.shape[0]} rows, config.json says vocab_size={shape.vocab_size}"
            )
        pad = weight.new_zeros((shape.padded_vocab_size - shape.vocab_size, *weight.shape[1:]))
        return torch.cat([weight, pad])
    if pm.kind == "qkv":
        q, k, v = hf_tensors
        groups, d, rest = shape.num_kv_heads, shape.head_dim, q.shape[1:]
        per_group = [
            q.reshape(groups, shape.heads_per_group * d, *rest),
            k.reshape(groups, d, *rest),
            v.reshape(groups, d, *rest),
        ]
        return torch.cat(per_group, dim=1).reshape(groups * (shape.heads_per_group + 2) * d, *rest)
    if pm.kind in ("gate_up", "stack"):
        return torch.cat(hf_tensors)
    raise ValueError(f"unknown parameter kind {pm.kind!r} for {pm.mcore}")


def to_hf(pm: ParamMap, full: torch.Tensor, shape: ModelShape) -> list[torch.Tensor]:
    """The HF tensors named by ``pm.hf`` (in that order) from the full Megatron tensor."""
    if pm.kind == "copy":
        return [full]
    if pm.kind == "vocab":
        return [full[: shape.vocab_size]]
    if pm.kind == "qkv":
        groups, d, rest = shape.num_kv_heads, shape.head_dim, full.shape[1:]
        q, k, v = full.reshape(groups, (shape.heads_per_group + 2) * d, *rest).split(
            [shape.heads_per_group * d, d, d], dim=1
        )
        return [q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)]
    if pm.kind == "gate_up":
        return list(full.chunk(2))
    if pm.kind == "stack":
        return list(full.chunk(len(pm.hf)))
    raise ValueError(f"unknown parameter kind {pm.kind!r} for {pm.mcore}")


def shard(pm: ParamMap, full: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Tensor-parallel rank ``rank``'s part of the full Megatron tensor (contiguous)."""
    if pm.tp_dim is None or size == 1:
        return full
    if full.shape[pm.tp_dim] % size:
        raise ValueError(
            f"{pm.mcore}: dim {pm.tp_dim} of {tuple(full.shape)} does not split into {size} ranks"
        )
    if pm.kind == "gate_up":
        gate, up = full.chunk(2)
        return torch.cat([gate.chunk(size)[rank], up.chunk(size)[rank]])
    return full.chunk(size, dim=pm.tp_dim)[rank].contiguous()


def unshard(pm: ParamMap, shards: Sequence[torch.Tensor]) -> torch.Tensor:
    """Inverse of :func:`shard`: the full tensor from every rank's part, in rank order."""
    if pm.tp_dim is None or len(shards) == 1:
        return shards[0]
    if pm.kind == "gate_up":
        halves = [s.chunk(2) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    return torch.cat(list(shards), dim=pm.tp_dim)

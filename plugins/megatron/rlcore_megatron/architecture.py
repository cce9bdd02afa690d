"""What the engine needs to know about a Hugging Face decoder, read from its ``config.json``.

Supported families, all GQA decoders with RMSNorm, SwiGLU and rope:

* Qwen2 (q/k/v bias, usually tied embeddings in small models) and Llama (no biases; optional Llama-3
  rope scaling);
* Qwen3 (no biases; an RMSNorm over each query and key head before rope, ``q_norm``/``k_norm``);
* the mixtures of experts Qwen3-MoE (Qwen3's attention; every layer's MLP is ``num_experts`` SwiGLU
  experts of ``moe_intermediate_size``, a linear router choosing ``num_experts_per_tok`` per token) and
  Mixtral (Llama's attention, the same kind of experts).

Anything else is rejected with the reason, before a model is built, rather than trained with silently
wrong numerics.
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class Family:
    """What distinguishes one supported HF ``model_type`` from another."""

    #: q/k/v projections carry a bias.
    qkv_bias: bool = False
    #: An RMSNorm over each query and key head (``self_attn.q_norm`` / ``k_norm``).
    qk_norm: bool = False
    #: The MLP is a mixture of experts.
    moe: bool = False
    #: Where the experts live in HF checkpoints, under ``model.layers.<i>.``: the block, and the names of
    #: each expert's ``(gate, up, down)`` projections.
    moe_block: str = "mlp"
    expert_projections: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")


#: HF ``model_type`` -> its :class:`Family`.
SUPPORTED_MODEL_TYPES = {
    "qwen2": Family(qkv_bias=True),
    "llama": Family(),
    "qwen3": Family(qk_norm=True),
    "qwen3_moe": Family(qk_norm=True, moe=True),
    "mixtral": Family(moe=True, moe_block="block_sparse_moe", expert_projections=("w1", "w3", "w2")),
}


@attrs.frozen
class Experts:
    """The mixture of experts of an MoE decoder (every layer has one)."""

    num_experts: int
    #: Experts per token (``num_experts_per_tok``).
    top_k: int
    #: Each expert's SwiGLU width.
    ffn_hidden_size: int
    #: The chosen experts' weights are renormalised to sum to 1 (softmax over the top-k router logits);
    #: False: softmax over all experts, the top-k taken as they are (Qwen3-MoE's ``norm_topk_prob``).
    normalize_top_k: bool
    #: HF's load-balancing loss coefficient (``router_aux_loss_coef``).
    aux_loss_coef: float
    #: HF's router z-loss coefficient (``router_z_loss_coef``), 0 when the config has none.
    z_loss_coef: float


#: Llama-3 rope scaling as megatron-core implements it (its low/high-frequency factors and original
#: context length are fixed there; only the factor is a parameter).
_MEGATRON_LLAMA3_ROPE = {
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@attrs.frozen
class ModelShape:
    """Dimensions of the decoder. ``padded_vocab_size`` rows are allocated; ``vocab_size`` are real."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    padded_vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    rms_norm_eps: float
    rope_theta: float
    #: Llama-3 rope scaling factor, or None for plain rope.
    rope_scaling_factor: float | None
    max_position_embeddings: int
    initializer_range: float
    #: The experts of an MoE decoder, None for a dense one.
    experts: Experts | None = None
    #: Where MoE checkpoints keep the experts (:class:`Family`).
    moe_block: str = "mlp"
    expert_projections: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads


def _rope(hf_config: Any) -> tuple[float, float | None]:
    """``(rope_theta, llama3 scaling factor or None)`` from a transformers 4 or 5 config."""
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    legacy = getattr(hf_config, "rope_scaling", None) or {}
    params = {**legacy, **params}
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type in (None, "default"):
        return float(theta), None
    if rope_type == "llama3":
        for key, expected in _MEGATRON_LLAMA3_ROPE.items():
            if float(params.get(key, expected)) != expected:
                raise ValueError(
                    f"rope scaling {key}={params.get(key)} is not supported: megatron-core's Llama-3 "
                    f"rope scaling fixes it to {expected}"
                )
        return float(theta), float(params["factor"])
    raise ValueError(
        f"rope_type {rope_type!r} is not supported by the megatron engine (supported: default, llama3)"
    )


def _experts(hf_config: Any, model_type: str, ep_size: int) -> Experts:
    """The experts of a ``qwen3_moe`` or ``mixtral`` config, checked against ``ep_size``."""
    if model_type == "qwen3_moe":
        num, width = hf_config.num_experts, hf_config.moe_intermediate_size
        sparse_step = getattr(hf_config, "decoder_sparse_step", 1)
        dense_layers = list(getattr(hf_config, "mlp_only_layers", None) or [])
        if sparse_step != 1 or dense_layers:
            raise ValueError(
                f"Qwen3-MoE configs with dense layers (decoder_sparse_step={sparse_step}, "
                f"mlp_only_layers={dense_layers}) are not supported by the megatron engine: every layer "
                f"must be a mixture of experts (as in the released Qwen3-MoE models)"
            )
        normalize = bool(getattr(hf_config, "norm_topk_prob", True))
    else:
        num, width, normalize = hf_config.num_local_experts, hf_config.intermediate_size, True
    if getattr(hf_config, "shared_expert_intermediate_size", 0):
        raise ValueError("shared experts are not supported by the megatron engine's MoE conversion")
    if num % ep_size:
        raise ValueError(
            f"megatron.expert_model_parallel_size={ep_size} must divide the number of experts ({num})"
        )
    return Experts(
        num_experts=num,
        top_k=hf_config.num_experts_per_tok,
        ffn_hidden_size=width,
        normalize_top_k=normalize,
        aux_loss_coef=float(getattr(hf_config, "router_aux_loss_coef", 0.0) or 0.0),
        z_loss_coef=float(getattr(hf_config, "router_z_loss_coef", 0.0) or 0.0),
    )


def model_shape(
    hf_config: Any,
    *,
    tp_size: int,
    pp_size: int,
    make_vocab_size_divisible_by: int,
    ep_size: int = 1,
) -> ModelShape:
    """Validate ``hf_config`` for this parallel layout and return the decoder's :class:`ModelShape`."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type {model_type!r} is not supported by the megatron engine; supported: "
            f"{', '.join(sorted(SUPPORTED_MODEL_TYPES))}. Use the fsdp engine for other architectures."
        )
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {hf_config.hidden_act!r} is not supported (only silu / SwiGLU)")
    if getattr(hf_config, "use_sliding_window", False):
        raise ValueError(
            "sliding-window attention (use_sliding_window=true) is not supported by the megatron engine"
        )
    family = SUPPORTED_MODEL_TYPES[model_type]
    if not family.qkv_bias and (
        getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False)
    ):
        raise ValueError(
            f"{model_type} configs with attention_bias or mlp_bias are not supported by the megatron engine"
        )
    experts = _experts(hf_config, model_type, ep_size) if family.moe else None
    if experts is None and ep_size > 1:
        raise ValueError(
            f"megatron.expert_model_parallel_size={ep_size} needs a mixture-of-experts model; "
            f"{model_type} is dense: set it to 1"
        )

    heads, layers = hf_config.num_attention_heads, hf_config.num_hidden_layers
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    if heads % kv_heads:
        raise ValueError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    if kv_heads % tp_size:
        raise ValueError(
            f"megatron.tensor_model_parallel_size={tp_size} must divide num_key_value_heads={kv_heads} "
            f"(each tensor-parallel rank holds whole query groups)"
        )
    width = experts.ffn_hidden_size if experts else hf_config.intermediate_size
    if width % tp_size:
        raise ValueError(
            f"megatron.tensor_model_parallel_size={tp_size} must divide the MLP's intermediate size {width}"
        )
    if layers % pp_size:
        raise ValueError(
            f"megatron.pipeline_model_parallel_size={pp_size} must divide num_hidden_layers={layers}"
        )
    theta, scaling = _rope(hf_config)
    multiple = make_vocab_size_divisible_by * tp_size
    vocab = hf_config.vocab_size
    return ModelShape(
        model_type=model_type,
        num_layers=layers,
        hidden_size=hf_config.hidden_size,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        ffn_hidden_size=width,
        vocab_size=vocab,
        padded_vocab_size=-(-vocab // multiple) * multiple,
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        qkv_bias=family.qkv_bias,
        qk_norm=family.qk_norm,
        rms_norm_eps=float(hf_config.rms_norm_eps),
        rope_theta=theta,
        rope_scaling_factor=scaling,
        max_position_embeddings=hf_config.max_position_embeddings,
        initializer_range=float(getattr(hf_config, "initializer_range", 0.02)),
        experts=experts,
        moe_block=family.moe_block,
        expert_projections=family.expert_projections,
    )

"""What the engine needs to know about a Hugging Face decoder, read from its ``config.json``.

Supported families: Qwen2 (qkv bias, GQA, RMSNorm, SwiGLU, usually tied embeddings in small models) and
Llama (no biases; optional Llama-3 rope scaling). Anything else is rejected with the reason, before a
model is built, rather than trained with silently wrong numerics.
"""

from __future__ import annotations

from typing import Any

import attrs

#: HF ``model_type`` -> whether q/k/v projections carry a bias.
SUPPORTED_MODEL_TYPES = {"qwen2": True, "llama": False}

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
    rms_norm_eps: float
    rope_theta: float
    #: Llama-3 rope scaling factor, or None for plain rope.
    rope_scaling_factor: float | None
    max_position_embeddings: int
    initializer_range: float

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


def model_shape(
    hf_config: Any, *, tp_size: int, pp_size: int, make_vocab_size_divisible_by: int
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
    if model_type == "llama" and (
        getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False)
    ):
        raise ValueError(
            "Llama configs with attention_bias or mlp_bias are not supported by the megatron engine"
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
    if hf_config.intermediate_size % tp_size:
        raise ValueError(
            f"megatron.tensor_model_parallel_size={tp_size} must divide intermediate_size={hf_config.intermediate_size}"
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
        ffn_hidden_size=hf_config.intermediate_size,
        vocab_size=vocab,
        padded_vocab_size=-(-vocab // multiple) * multiple,
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        qkv_bias=SUPPORTED_MODEL_TYPES[model_type],
        rms_norm_eps=float(hf_config.rms_norm_eps),
        rope_theta=theta,
        rope_scaling_factor=scaling,
        max_position_embeddings=hf_config.max_position_embeddings,
        initializer_range=float(getattr(hf_config, "initializer_range", 0.02)),
    )

"""What a model's training holds in device memory, per token and per rank: the default micro-batch's budget.

A fixed row count is the wrong default in both directions. Eight rows of a tiny model on a CPU leave
most of a step to per-micro-batch fixed costs (on the 2-core box, 64 micro-batches of 8 took 2-4x the time of a
few large ones for the same tokens, ``docs/benchmarks.md``); eight rows of 8k tokens of a 7B model do
not fit an 80 GB GPU. So when neither ``micro_batch_size`` nor ``max_tokens_per_micro_batch`` is set, the
train worker, which knows its device, resolves ``EngineSpec.max_tokens_per_micro_batch = "auto"`` into
a token budget before it builds the engine:

``budget = ACTIVATION_FRACTION * (device memory - model states per rank) / activation bytes per token``

clamped to ``[longest sequence, MAX_TOKENS]``. Activation bytes per token count what a decoder layer
keeps for its backward with an attention kernel that does not store the ``T x T`` scores (SDPA, flash)
(the inputs of both norms, q/k/v, the attention output, the MLP's gate, up and activation; Korthikanti
et al., 2022, without their score term), in the dtype the engine computes in (its
``activation_dtype``: bf16 under mixed precision, whatever the parameters' dtype), times ``OVERHEAD``
for autograd temporaries and allocator slack; with gradient checkpointing a layer keeps only its input,
plus one layer's full set while it is recomputed; a role that is never trained (the reference model)
keeps nothing for a backward, so only one layer's set is alive at a time. Model states are the
parameters, their gradients and AdamW's two fp32 moments, divided by the ranks that shard them. Engines that cannot budget tokens fall back to ``micro_batch_size``, set to
the rows of the longest sequence that fit the budget.
"""

from __future__ import annotations

from typing import Any

import attrs

from rlcore.api.train_engine import AUTO_MICRO_BATCH, EngineSpec

#: The ``max_tokens_per_micro_batch`` value a worker resolves from its device (see the module doc).
AUTO = AUTO_MICRO_BATCH
#: Share of the device memory left after model states that a micro-batch's activations may take. The
#: rest is for the rollout engine when colocated (vLLM/SGLang take their own fraction on GPUs), the
#: logits head's chunks and fragmentation.
ACTIVATION_FRACTION = 0.25
#: Multiplier on the counted activations for autograd temporaries and allocator slack.
OVERHEAD = 2.0
#: Larger micro-batches no longer pay. On the 2-core CPU, 512 sequences of 146 tokens of the tiny model
#: train in 4.45 s/step with 4k, 8k or 16k tokens per micro-batch, 4.6 s with 32k and 8.5-10 s with 37k-75k
#: (activations outgrow the caches), against 19.6 s in micro-batches of 8 rows. verl's default
#: ``ppo_max_token_len_per_gpu`` is 16384 as well.
MAX_TOKENS = 16384

_DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}


@attrs.frozen
class ModelShape:
    """What the estimate needs from a Hugging Face config (``hidden_size`` ... ``vocab_size``)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool

    @classmethod
    def from_hf_config(cls, config: Any) -> ModelShape:
        tied = bool(getattr(config, "tie_word_embeddings", False))
        # A vision-language model's language part (its vision tower's activations are not counted).
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        hidden = int(config.hidden_size)
        heads = int(getattr(config, "num_attention_heads", 1) or 1)
        return cls(
            hidden=hidden,
            intermediate=int(getattr(config, "intermediate_size", None) or 4 * hidden),
            layers=int(config.num_hidden_layers),
            heads=heads,
            kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            vocab=int(config.vocab_size),
            tied=tied or bool(getattr(config, "tie_word_embeddings", False)),
        )

    def parameters(self) -> int:
        """Parameter count of a Llama/Qwen-style decoder (norms and biases left out: < 0.1%)."""
        head_dim = self.hidden // self.heads
        attention = self.hidden * (self.hidden + 2 * self.kv_heads * head_dim) + self.hidden * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * (attention + mlp) + embeddings

    def activation_bytes_per_token(
        self, dtype_bytes: int, gradient_checkpointing: bool, backward: bool = True
    ) -> int:
        """Bytes one token's activations hold from forward to backward, or, without a ``backward``
        (inference), at the peak of a forward (see the module doc)."""
        kv = 2 * self.kv_heads * (self.hidden // self.heads)
        per_layer = (5 * self.hidden + kv + 3 * self.intermediate) * dtype_bytes
        if not backward:
            kept = per_layer
        elif gradient_checkpointing:
            kept = self.layers * self.hidden * dtype_bytes + per_layer
        else:
            kept = self.layers * per_layer
        # The head's hidden input and its fp32 log-prob/entropy outputs; its logits are chunked.
        kept += self.hidden * dtype_bytes + 16
        return int(OVERHEAD * kept)


def token_budget(
    shape: ModelShape,
    *,
    device_bytes: float,
    dtype: str,
    gradient_checkpointing: bool,
    trainable: bool,
    shards: int,
    longest: int,
    activation_dtype: str | None = None,
) -> int:
    """Tokens per micro-batch for ``shape`` on a device of ``device_bytes`` (see the module doc);
    at least ``longest`` (a sequence cannot be split), at most :data:`MAX_TOKENS`. ``dtype``: the
    parameters'; ``activation_dtype``: what the forward computes in (default ``dtype``)."""
    dtype_bytes = _DTYPE_BYTES.get(dtype, 4)
    # weights + (gradients + two fp32 AdamW moments when trained), sharded over ``shards`` ranks
    per_param = dtype_bytes + ((dtype_bytes + 8) if trainable else 0)
    states = shape.parameters() * per_param / max(1, shards)
    free = max(0.0, device_bytes - states)
    per_token = shape.activation_bytes_per_token(
        _DTYPE_BYTES.get(activation_dtype or dtype, 4),
        gradient_checkpointing and trainable,
        backward=trainable,
    )
    budget = int(ACTIVATION_FRACTION * free / per_token)
    return max(longest, min(MAX_TOKENS, budget))


def model_shape(model_path: str) -> ModelShape:
    """The :class:`ModelShape` of the Hugging Face model at ``model_path`` (its config alone is read)."""
    from transformers import AutoConfig

    return ModelShape.from_hf_config(AutoConfig.from_pretrained(model_path))


def auto_budget(
    spec: EngineSpec,
    *,
    device_bytes: float,
    shards: int,
    activation_dtype: str | None = None,
    shape: ModelShape | None = None,
) -> int:
    """The token budget ``max_tokens_per_micro_batch: auto`` becomes for ``spec`` on this device;
    ``shape``: the model's, when the caller has read it already (default: from its HF config)."""
    return token_budget(
        shape or model_shape(spec.model_path),
        device_bytes=device_bytes,
        dtype=spec.dtype,
        gradient_checkpointing=spec.gradient_checkpointing,
        trainable=spec.trainable,
        shards=shards,
        longest=spec.max_sequence_length or 1,
        activation_dtype=activation_dtype,
    )

"""The ``fsdp:`` config section."""

import attrs

#: Attention backends that keep packed sequences apart: rlcore's ``varlen`` (:mod:`rlcore_fsdp.attention`,
#: work ``sum L**2``), and Hugging Face's through ``position_ids`` resets (``sdpa``/``eager`` with a
#: block-diagonal ``[N, N]`` mask from ``transformers.masking_utils``, flash-attention through its var-len
#: kernels). The engine also probes the loaded model before it packs anything.
PACKING_ATTENTION = ("varlen", "sdpa", "eager", "flash_attention_2", "flash_attention_3")


def _positive(instance, attribute, value):
    if value < 1:
        raise ValueError(f"fsdp.{attribute.name} must be >= 1, got {value}")


def _mixed_precision(instance, attribute, value):
    if value not in (None, "bfloat16"):
        raise ValueError(
            f"fsdp.mixed_precision must be 'bfloat16' or null, got {value!r} "
            "(float16 would need loss scaling, which this engine does not do)"
        )


@attrs.define
class FSDPConfig:
    """Settings specific to the FSDP2 engine (model-independent ones live in the role sections)."""

    #: Free each decoder layer's gathered parameters after its forward (ZeRO-3); False keeps them
    #: gathered until the backward (ZeRO-2-like: more memory, one all-gather less per layer).
    reshard_after_forward: bool = True
    #: Compute dtype for mixed precision (``"bfloat16"``: parameters gathered and used in bf16, gradients
    #: reduced and stored in fp32), or None to compute in the parameter dtype (``EngineSpec.dtype``).
    mixed_precision: str | None = attrs.field(default=None, validator=_mixed_precision)
    #: Keep sharded parameters, gradients and optimizer state in CPU memory (FSDP2 ``CPUOffloadPolicy``);
    #: the optimizer step then runs on the CPU.
    cpu_offload: bool = False
    #: Drop padding and pack each micro-batch's sequences into one row (``position_ids`` restart at 0 per
    #: sequence). Needs an attention backend in :data:`PACKING_ATTENTION`; the engine refuses otherwise.
    use_remove_padding: bool = False
    #: Hugging Face ``attn_implementation`` the model is loaded with, or ``"varlen"``: rlcore's padding-free
    #: attention over packed sequences (PyTorch's flash var-len kernel where the device has it, one SDPA
    #: call per sequence elsewhere; needs ``use_remove_padding``).
    attn_implementation: str = "sdpa"
    #: Tokens per chunk when computing log-probs and entropy from the output layer, so fp32 logits exist
    #: for at most this many tokens at a time (``[chunk, vocab]``); in training each chunk's logits are
    #: recomputed in the backward unless ``recompute_logits`` is false (:mod:`rlcore.kernels.logits`).
    logits_chunk_size: int = attrs.field(default=1024, validator=_positive)
    #: Recompute each chunk's logits in the backward (True), or keep them from the forward in the compute
    #: dtype (False): saves one output-layer matmul per token (about 5% of a 1.5B model's training FLOPs,
    #: more for smaller models) for ``tokens * vocab * 2`` bytes per micro-batch in bf16 (5 GB for 16k
    #: tokens of a 150k vocabulary). The gradients are the same either way.
    recompute_logits: bool = True
    #: ``torch.compile`` each decoder layer (dynamic shapes) before sharding, as torchtitan does, and the
    #: log-prob head's vocabulary-wide elementwise work: fuses the norms, rotary embedding, activation and
    #: softmax statistics into fewer kernels. The first steps pay the compile time; worth it for long runs
    #: on an accelerator.
    compile: bool = False
    #: Reduce gradients once per optimizer step instead of after every micro-batch: the micro-batches
    #: before the last accumulate unsharded fp32 gradients and keep the gathered weights (FSDP2's
    #: ``set_requires_gradient_sync(False)`` / ``set_reshard_after_backward(False)``), so a step does one
    #: gather and one reduce-scatter per layer, as DDP would. Costs a full fp32 gradient and the gathered
    #: weights per rank: for models that fit that way; pair with ``reshard_after_forward: false``.
    reduce_grads_once_per_step: bool = False
    #: Ulysses sequence parallelism (verl's ``ulysses_sequence_parallel_size``): each group of this many
    #: consecutive ranks holds the same rows, and each rank of it a 1/size slice of every packed
    #: micro-batch; attention exchanges q/k/v so each rank attends over the whole sequence for 1/size of the
    #: heads (two all-to-alls per layer). Parameters stay sharded over all ranks. For sequences too long for
    #: one device's activations. Must divide the role's world size (``world_size / size`` data-parallel
    #: ranks) and the model's attention heads (key/value heads too, or be a multiple of them); needs
    #: ``use_remove_padding: true`` with ``attn_implementation: varlen``. ``max_tokens_per_micro_batch``
    #: then counts tokens per rank: a micro-batch packs up to ``size`` times as many.
    sequence_parallel_size: int = attrs.field(default=1, validator=_positive)
    #: AdamW's fused kernel (``torch.optim.AdamW(fused=True)``): one launch per parameter group instead
    #: of several per-tensor ops; None lets torch choose (its per-op ``foreach`` path).
    fused_optimizer: bool | None = True

"""The ``fsdp:`` config section."""

import attrs

#: Attention backends that keep packed sequences apart: rlcore's ``varlen`` (:mod:`rlcore_fsdp.attention`,
#: work ``sum L**2``), and Hugging Face's through ``position_ids`` resets (``sdpa``/``eager`` with a
#: block-diagonal ``[N, N]`` mask from ``transformers.masking_utils``, flash-attention through its var-len
#: kernels). The engine also probes the loaded model before it packs anything.
PACKING_ATTENTION = ("varlen", "sdpa", "eager", "flash_attention_2", "flash_attention_3")
#: The value of the fields the engine decides from the device and the model at start-up
#: (:mod:`rlcore_fsdp.defaults`: on GPUs the throughput path, on CPUs the plain settings; the worker's and
#: the run's log say what each became and why).
AUTO = "auto"


def _positive(instance, attribute, value):
    if value < 1:
        raise ValueError(f"fsdp.{attribute.name} must be >= 1, got {value}")


def _mixed_precision(instance, attribute, value):
    if value not in (None, "bfloat16", AUTO):
        raise ValueError(
            f"fsdp.mixed_precision must be 'bfloat16', null or 'auto', got {value!r} "
            "(float16 would need loss scaling, which this engine does not do)"
        )


def _auto_or_bool(instance, attribute, value):
    if not isinstance(value, bool) and value != AUTO:
        raise ValueError(f"fsdp.{attribute.name} must be true, false or 'auto', got {value!r}")


def _auto_or_positive(instance, attribute, value):
    if value != AUTO and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"fsdp.{attribute.name} must be an integer >= 1 or 'auto', got {value!r}")


@attrs.define
class FSDPConfig:
    """Settings specific to the FSDP2 engine (model-independent ones live in the role sections)."""

    #: Free each decoder layer's gathered parameters after its forward (ZeRO-3); False keeps them
    #: gathered until the backward (ZeRO-2-like: more memory, one all-gather less per layer). ``auto``: False
    #: where the device takes the fast path and the memory rule says the gathered weights fit (with
    #: ``reduce_grads_once_per_step``), else True.
    reshard_after_forward: bool | str = attrs.field(default=AUTO, validator=_auto_or_bool)
    #: Compute dtype for mixed precision (``"bfloat16"``: parameters gathered and used in bf16, gradients
    #: reduced and stored in fp32), or None to compute in the parameter dtype (``EngineSpec.dtype``).
    #: ``auto``: bfloat16 over fp32 parameters where the device takes the fast path, else None.
    mixed_precision: str | None = attrs.field(default=AUTO, validator=_mixed_precision)
    #: Keep sharded parameters, gradients and optimizer state in CPU memory (FSDP2 ``CPUOffloadPolicy``);
    #: the optimizer step then runs on the CPU.
    cpu_offload: bool = False
    #: Drop padding and pack each micro-batch's sequences into one row (``position_ids`` restart at 0 per
    #: sequence). Needs an attention backend in :data:`PACKING_ATTENTION`; the engine refuses otherwise.
    #: ``auto``: True where the device takes the fast path (with ``varlen`` attention) unless the model
    #: attends in sliding windows, else False.
    use_remove_padding: bool | str = attrs.field(default=AUTO, validator=_auto_or_bool)
    #: Hugging Face ``attn_implementation`` the model is loaded with, or ``"varlen"``: rlcore's padding-free
    #: attention over packed sequences (PyTorch's flash var-len kernel where the device has it, one SDPA
    #: call per sequence elsewhere; needs ``use_remove_padding``). ``auto``: ``varlen`` with packed
    #: micro-batches, else the platform's attention (``sdpa``).
    attn_implementation: str = AUTO
    #: Tokens per chunk when computing log-probs and entropy from the output layer, so fp32 logits exist
    #: for at most this many tokens at a time (``[chunk, vocab]``); in training each chunk's logits are
    #: recomputed in the backward unless ``recompute_logits`` is false (:mod:`rlcore.kernels.logits`).
    #: ``auto``: 4096 where the device takes the fast path, else 1024.
    logits_chunk_size: int | str = attrs.field(default=AUTO, validator=_auto_or_positive)
    #: Recompute each chunk's logits in the backward (True), or keep them from the forward in the compute
    #: dtype (False): saves one output-layer matmul per token (about 5% of a 1.5B model's training FLOPs,
    #: more for smaller models) for ``tokens * vocab * 2`` bytes per micro-batch in bf16 (5 GB for 16k
    #: tokens of a 150k vocabulary). The gradients are the same either way. ``auto``: False where the
    #: device takes the fast path and the memory rule says the kept logits fit, else True.
    recompute_logits: bool | str = attrs.field(default=AUTO, validator=_auto_or_bool)
    #: ``torch.compile`` each decoder layer (dynamic shapes) before sharding, as torchtitan does, and the
    #: log-prob head's vocabulary-wide elementwise work: fuses the norms, rotary embedding, activation and
    #: softmax statistics into fewer kernels. The first steps pay the compile time; worth it for long runs
    #: on an accelerator. ``auto``: True where the device takes the fast path and the run has at least 20
    #: optimizer steps (``rlcore_fsdp.defaults.COMPILE_MIN_STEPS``), else False.
    compile: bool | str = attrs.field(default=AUTO, validator=_auto_or_bool)
    #: Reduce gradients once per optimizer step instead of after every micro-batch: the micro-batches
    #: before the last accumulate unsharded fp32 gradients and keep the gathered weights (FSDP2's
    #: ``set_requires_gradient_sync(False)`` / ``set_reshard_after_backward(False)``), so a step does one
    #: gather and one reduce-scatter per layer, as DDP would. Costs a full fp32 gradient and the gathered
    #: weights per rank: for models that fit that way; pair with ``reshard_after_forward: false``.
    #: ``auto``: decided with ``reshard_after_forward`` (True when that is False, for trained roles).
    reduce_grads_once_per_step: bool | str = attrs.field(default=AUTO, validator=_auto_or_bool)
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

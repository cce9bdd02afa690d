"""The ``fsdp:`` config section."""

import attrs


@attrs.define
class FSDPConfig:
    """Settings specific to the FSDP2 engine (model-independent ones live in the role sections)."""

    #: Shard parameters per decoder layer and at the root (FSDP2 ``fully_shard``); False: replicate.
    reshard_after_forward: bool = True
    #: Compute dtype for bf16 mixed precision (``"bfloat16"``), or None for full precision.
    mixed_precision: str | None = None
    #: Keep parameters, gradients and optimizer state on the CPU between steps (FSDP2 CPUOffloadPolicy).
    cpu_offload: bool = False
    #: Remove padding and pack variable-length sequences into one row where the attention supports it.
    use_remove_padding: bool = False
    #: Vocabulary chunk size for log-prob / entropy so full fp32 logits never exist for the whole batch.
    logits_chunk_size: int = 1024

"""The ``megatron:`` config section. Light to import (attrs only).

Model-independent settings (learning rate, micro-batch size, dtype ...) live in the role sections and
reach the engine as :class:`rlcore.api.EngineSpec`; this section holds only what is Megatron's own.
"""

from __future__ import annotations

from typing import Any

import attrs

TRANSFORMER_IMPLS = ("local", "transformer_engine")


def _positive(instance: Any, attribute: attrs.Attribute, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"megatron.{attribute.name} must be an integer >= 1, got {value!r}")


def _impl(instance: Any, attribute: attrs.Attribute, value: str) -> None:
    if value not in TRANSFORMER_IMPLS:
        raise ValueError(
            f"megatron.{attribute.name} must be one of {', '.join(TRANSFORMER_IMPLS)}; got {value!r}"
        )


def replica_error(world: int, tp: int, pp: int, key: str, ep: int = 1) -> str | None:
    """Why ``world`` ranks (set by ``key``) do not split into model replicas of ``tp x pp`` ranks (and,
    with expert parallelism, the data-parallel ranks into groups of ``ep``), or None. Checked when the
    config loads (the actor) and when each worker group starts (every role)."""
    if world % (tp * pp * ep) == 0:
        return None
    if ep == 1:
        return (
            f"{key}={world} is not a multiple of megatron.tensor_model_parallel_size * "
            f"megatron.pipeline_model_parallel_size = {tp} * {pp}: set {key} to a multiple of {tp * pp} "
            f"(e.g. {key}={tp * pp}), or lower the parallel sizes"
        )
    return (
        f"{key}={world} is not a multiple of megatron.tensor_model_parallel_size * "
        f"megatron.pipeline_model_parallel_size * megatron.expert_model_parallel_size = {tp} * {pp} * {ep} "
        f"(experts are spread over data-parallel ranks): set {key} to a multiple of {tp * pp * ep}, or "
        f"lower the parallel sizes"
    )


@attrs.define(kw_only=True)
class MegatronConfig:
    """Parallel layout and Megatron-specific switches of the ``megatron`` train engine.

    The data-parallel size is what is left: ``world_size / (tensor_model_parallel_size *
    pipeline_model_parallel_size)``.
    """

    #: Tensor-parallel ranks per model replica (must divide the attention's query groups).
    tensor_model_parallel_size: int = attrs.field(default=1, validator=_positive)
    #: Pipeline stages per model replica (must divide the number of layers).
    pipeline_model_parallel_size: int = attrs.field(default=1, validator=_positive)
    #: Mixture-of-experts models: ranks each layer's experts are spread over (each holds
    #: ``num_experts / expert_model_parallel_size`` of them; tokens travel to their experts and back by
    #: all-to-all). The ranks are data-parallel ones: it must divide ``world_size / (tensor x pipeline)``.
    #: Expert weights are split over the tensor-parallel ranks as the dense layers' are.
    expert_model_parallel_size: int = attrs.field(default=1, validator=_positive)
    #: Coefficient of the router's load-balancing loss (Switch/GShard ``E * sum_e f_e * P_e`` per layer,
    #: megatron-core's ``aux_loss``); null: the model's own ``router_aux_loss_coef`` from config.json.
    #: 0 turns it off. megatron-core adds it per micro-batch and layer, over the tokens of the
    #: micro-batch (HF's is one loss over the batch, divided by the number of layers).
    moe_aux_loss_coeff: float | None = None
    #: Coefficient of the router z-loss (``mean(logsumexp(router logits)^2)``, ST-MoE); null: the model's
    #: ``router_z_loss_coef`` if config.json has one, else 0 (off).
    moe_z_loss_coeff: float | None = None
    #: Compute each MoE layer's local experts with one grouped GEMM per projection
    #: (``torch.nn.functional.grouped_mm``, PyTorch 2.9+; on NVIDIA GPUs bf16 needs Hopper or newer) instead
    #: of megatron-core's one matmul per expert: the same parameters and numbers, about 30x the expert
    #: throughput at Qwen3-30B-A3B's shape on an H200 (``rlcore_megatron/experts.py``).
    moe_grouped_gemm: bool = True
    #: Compute the dense SwiGLU MLP's gate and up projections as two GEMMs on the two row halves of
    #: megatron-core's fused ``linear_fc1`` weight (the same parameter: checkpoints and the HF conversion are
    #: unchanged) instead of one GEMM into ``[tokens, 2F/tp]``, so the activation's backward writes the
    #: gate and up gradients apart rather than as one concatenated ``[tokens, 2F/tp]`` tensor, which cost
    #: twice the SwiGLU backward's time on a Qwen3-1.7B step on an H200 (``rlcore_megatron/mlp.py``).
    #: ``transformer_impl: local`` only; mixture-of-experts layers are unaffected. false: megatron-core's MLP.
    split_gate_up: bool = True
    #: Shard the optimizer state (and fp32 master weights) over data-parallel ranks (ZeRO-1).
    use_distributed_optimizer: bool = True
    #: Split activations along the sequence inside tensor-parallel regions (norms, residuals and dropout
    #: on ``1 / tensor_model_parallel_size`` of the tokens per rank; all-gather / reduce-scatter instead
    #: of all-reduce around each parallel block). Always on for mixture-of-experts models with tensor
    #: parallelism: megatron-core trains MoE layers under tensor parallelism only that way.
    sequence_parallel: bool = False
    #: ``local``: megatron-core's own layers (runs everywhere); ``transformer_engine``: NVIDIA
    #: Transformer Engine's fused layers (needs the ``transformer_engine`` package).
    transformer_impl: str = attrs.field(default="local", validator=_impl)
    #: Sequences per micro-batch in ``infer``; None: the role's ``micro_batch_size``.
    infer_micro_batch_size: int | None = attrs.field(default=None, validator=_positive)
    #: Reduce gradients in fp32 even when parameters are bf16.
    grad_reduce_in_fp32: bool = True
    #: Overlap the data-parallel gradient reduction with the backward pass.
    overlap_grad_reduce: bool = False
    #: Gradient bucket size in elements for the data-parallel reduction; None: Megatron's default.
    ddp_bucket_size: int | None = attrs.field(default=None, validator=_positive)
    #: Pad the vocabulary to a multiple of this times the tensor-parallel size (padded rows are
    #: zero and never reach log-probs or the exported weights).
    make_vocab_size_divisible_by: int = attrs.field(default=128, validator=_positive)
    #: Adam epsilon.
    adam_eps: float = 1e-8
    #: Without Transformer Engine or Apex (whose fused Adam megatron-core prefers), run megatron-core's
    #: fallback ``torch.optim.AdamW`` as PyTorch's fused kernel (one pass over the fp32 state instead of its
    #: multi-tensor form's dozen), where PyTorch has it for the parameters' device, as ``fsdp.fused_optimizer``.
    fused_optimizer: bool = True
    #: Drop padding and pack each micro-batch's sequences into one row (Megatron's ``thd`` layout, rotary
    #: positions restarting at 0 per sequence); attention stays within each sequence through PyTorch's flash
    #: var-len kernel where the device has it, one SDPA call per sequence elsewhere. Needs
    #: ``transformer_impl: local``. With ``max_tokens_per_micro_batch``, micro-batches are planned by real
    #: tokens and token-balanced, as the FSDP engine plans them.
    use_remove_padding: bool = False
    #: Compute the language-model head (output projection, log-probs, entropy) this many tokens at a time,
    #: on the positions that predict response tokens only (prompt positions' logits are never used), so a
    #: micro-batch's ``[tokens, V/tp]`` logits never exist at once (they are most of the activation
    #: memory of a small model with a large vocabulary). At tensor-parallel size 1 this is rlcore's fused
    #: head (``rlcore.kernels.logits``, the FSDP engine's: one autograd function, its elementwise work compiled with
    #: ``compile``); with TP the same kernels on each rank's vocabulary slice, whose statistics the ranks
    #: combine with one all-gather per chunk. ``null``: the whole micro-batch at once, as megatron-core's
    #: output layer computes it.
    logits_chunk_size: int | None = attrs.field(default=None, validator=_positive)
    #: With ``logits_chunk_size``: recompute each chunk's logits in the backward (least memory) or, false,
    #: keep them from the forward (one ``[tokens, V]`` projection less per micro-batch, for the memory of
    #: the logits: at TP > 1 each rank keeps its ``[tokens, V / tp]`` slice), as ``fsdp.recompute_logits``.
    recompute_logits: bool = True
    #: ``torch.compile`` each decoder layer (dynamic shapes), as ``fsdp.compile`` does, and (with
    #: ``logits_chunk_size``) the head's vocabulary-wide elementwise work: Megatron's distributed-optimizer
    #: and gradient hooks stay outside the compiled code. The first steps pay the compile time (each new
    #: micro-batch shape may recompile once); worth it for long runs on a GPU.
    compile: bool = False

    def check_run(self, config) -> list[str]:
        """Against the run's config (``rlcore.config.RLConfig``): the actor's ranks must split into
        tensor x pipeline parallel model replicas; each problem as one message naming the keys."""
        error = replica_error(
            config.actor.world_size,
            self.tensor_model_parallel_size,
            self.pipeline_model_parallel_size,
            "actor.world_size",
            self.expert_model_parallel_size,
        )
        return [] if error is None else [error]

    def __attrs_post_init__(self) -> None:
        if self.use_remove_padding and self.transformer_impl != "local":
            raise ValueError(
                "megatron.use_remove_padding puts rlcore's packed attention into megatron-core's local layer "
                "spec; it needs megatron.transformer_impl=local (Transformer Engine's own thd path is untested)"
            )

"""Building this pipeline stage's megatron-core GPT model from a :class:`ModelShape`.

megatron-core 0.19 marks ``GPTModel`` deprecated in favour of ``HybridModel``, whose layer specs need
Transformer Engine; ``GPTModel`` still works there unchanged and is the only class 0.16 (the last
release for Python 3.11) has, so it is used for both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core import parallel_state, tensor_parallel
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer import TransformerConfig

from rlcore_megatron.architecture import ModelShape
from rlcore_megatron.config import MegatronConfig
from rlcore_megatron.convert import ParamMap
from rlcore_megatron.hf_io import local_to_global

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def param_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"the megatron engine trains in {', '.join(DTYPES)}; got dtype {name!r}")
    return DTYPES[name]


def transformer_config(
    shape: ModelShape, cfg: MegatronConfig, dtype: torch.dtype, *, recompute: bool
) -> TransformerConfig:
    """Megatron's config for an HF decoder of ``shape``, numerically matching the HF model (no dropout)."""
    tp = cfg.tensor_model_parallel_size
    return TransformerConfig(
        **_moe_settings(shape, cfg),
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        num_attention_heads=shape.num_heads,
        num_query_groups=shape.num_kv_heads,
        kv_channels=shape.head_dim,
        ffn_hidden_size=shape.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=shape.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=shape.qkv_bias,
        qk_layernorm=shape.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=shape.initializer_range,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=cfg.pipeline_model_parallel_size,
        sequence_parallel=sequence_parallel_enabled(shape, cfg),
        # Parameters are created on the host without random init and filled from the HF checkpoint
        # before they move to the device, so no device memory or time goes to a throw-away init.
        use_cpu_initialization=True,
        perform_initialization=False,
        # Micro-batches differ in length. megatron-core would exchange each hand-off's shape between
        # pipeline stages (a device sync each); the engine answers that from its own plan
        # (rlcore_megatron.handoffs).
        variable_seq_lengths=True,
        # megatron-core's default waits for the whole device after every batched send/receive, a
        # workaround for a batch_isend_irecv race fixed in PyTorch 1.13 (pytorch#82450); waiting on the
        # requests suffices now, and the device queue is not drained at every pipeline hand-off.
        batch_p2p_sync=False,
        moe_token_dispatcher_type="alltoall",
        # The loss function divides by the global token count itself: Megatron must neither divide
        # by the number of micro-batches nor average gradients over data-parallel ranks.
        calculate_per_token_loss=True,
        deallocate_pipeline_outputs=True,
        recompute_granularity="full" if recompute else None,
        recompute_method="uniform" if recompute else None,
        recompute_num_layers=1 if recompute else None,
    )


def _moe_settings(shape: ModelShape, cfg: MegatronConfig) -> dict:
    """The mixture-of-experts part of :func:`transformer_config` (nothing for a dense model).

    HF's routers take a softmax over all experts and keep the top k; Qwen3-MoE (``norm_topk_prob``)
    and Mixtral then renormalise the k weights, which is megatron-core's default order (top k of the
    logits, softmax over those k: the same numbers); without renormalisation the softmax goes first
    (``moe_router_pre_softmax``). No capacity limit: no token is dropped, as in HF.
    """
    experts = shape.experts
    if experts is None:
        return {}
    aux = experts.aux_loss_coef if cfg.moe_aux_loss_coeff is None else cfg.moe_aux_loss_coeff
    z_loss = experts.z_loss_coef if cfg.moe_z_loss_coeff is None else cfg.moe_z_loss_coeff
    return dict(
        num_moe_experts=experts.num_experts,
        moe_router_topk=experts.top_k,
        moe_ffn_hidden_size=experts.ffn_hidden_size,
        moe_router_pre_softmax=not experts.normalize_top_k,
        moe_router_load_balancing_type="aux_loss" if aux > 0 else "none",
        moe_aux_loss_coeff=aux,
        moe_z_loss_coeff=z_loss or None,
        expert_model_parallel_size=cfg.expert_model_parallel_size,
        expert_tensor_parallel_size=cfg.tensor_model_parallel_size,
    )


def _router_without_transformer_engine() -> None:
    """megatron-core 0.16's router reads ``moe_utils.te_general_gemm``, which it defines only when
    Transformer Engine imports (a ``NameError`` at the first routed token otherwise); None is its own
    marker for "use torch.mm"."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


class SequenceParallelRMSNorm(torch.nn.RMSNorm):
    """torch's RMSNorm for megatron-core's local layers, sequence parallelism allowed.

    Under sequence parallelism each tensor-parallel rank normalises its own part of the sequence, so its
    weight gradient is a partial sum; tagged ``sequence_parallel``, Megatron's gradient finalisation
    sums it over the tensor-parallel ranks (as it does for Transformer Engine's norms). megatron-core's
    own local norm (``WrappedTorchNorm``) refuses sequence parallelism instead of tagging its weight.
    Called by megatron-core as ``(config=, hidden_size=, eps=)``: ``[s/tp, b, h] -> [s/tp, b, h]``.
    """

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **_):
        super().__init__(hidden_size, eps=eps)
        self.weight.sequence_parallel = config.sequence_parallel


def sequence_parallel_enabled(shape: ModelShape, cfg: MegatronConfig) -> bool:
    """Whether activations are split along the sequence in tensor-parallel regions: when asked, and
    always for a mixture of experts with tensor parallelism (megatron-core trains MoE layers under
    tensor parallelism only with it)."""
    return cfg.tensor_model_parallel_size > 1 and (cfg.sequence_parallel or shape.experts is not None)


def layer_spec(cfg: MegatronConfig, shape: ModelShape, sequence_parallel: bool = False):
    num_experts = shape.experts.num_experts if shape.experts else None
    if num_experts is not None:
        _router_without_transformer_engine()
    if cfg.transformer_impl == "transformer_engine":
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        if num_experts is not None:
            raise ValueError(
                "mixture-of-experts models run with megatron.transformer_impl=local (Transformer Engine's "
                "expert layers are untested here)"
            )
        return get_gpt_layer_with_transformer_engine_spec(qk_layernorm=shape.qk_norm)
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(
        num_experts=num_experts, qk_layernorm=shape.qk_norm, normalization="RMSNorm"
    )
    if sequence_parallel:
        layer = spec.submodules
        layer.input_layernorm = layer.pre_mlp_layernorm = SequenceParallelRMSNorm
        if shape.qk_norm:
            layer.self_attention.submodules.q_layernorm = SequenceParallelRMSNorm
            layer.self_attention.submodules.k_layernorm = SequenceParallelRMSNorm
    if cfg.use_remove_padding:
        from rlcore_megatron.attention import PackedDotProductAttention

        spec.submodules.self_attention.submodules.core_attention = PackedDotProductAttention
    return spec


class ScalarHead(torch.nn.Module):
    """A ``hidden -> 1`` projection in place of the vocabulary output layer (critic / reward model).

    Called by ``GPTModel`` like its output layer: ``(hidden [s, b, h]) -> (values [s, b, 1], None)``.
    With a bias for a critic (HF's ``...ForTokenClassification.score``), without for a reward model
    (``...ForSequenceClassification.score``).
    Its weight is replicated on every tensor-parallel rank; under sequence parallelism the sequence is
    gathered first, with a backward that only splits (every rank computes the same values and loss).
    """

    def __init__(self, config: TransformerConfig, bias: bool):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(1, config.hidden_size, dtype=config.params_dtype))
        self.bias = torch.nn.Parameter(torch.empty(1, dtype=config.params_dtype)) if bias else None
        self.sequence_parallel = config.sequence_parallel

    def forward(self, hidden: torch.Tensor, weight=None, runtime_gather_output=None):
        if self.sequence_parallel:
            hidden = tensor_parallel.gather_from_sequence_parallel_region(
                hidden, tensor_parallel_output_grad=False
            )
        return F.linear(hidden, self.weight, self.bias), None


def build_stage_model(
    shape: ModelShape, cfg: MegatronConfig, config: TransformerConfig, *, head: str, first: bool, last: bool
) -> GPTModel:
    """This pipeline stage's GPT model on the host, parameters uninitialised (to be loaded)."""
    lm = head == "lm"
    spec = layer_spec(cfg, shape, config.sequence_parallel)
    if config.sequence_parallel and cfg.transformer_impl == "local":
        # The final norm too (megatron-core builds it from its own local norm otherwise).
        from megatron.core.transformer.transformer_block import (
            TransformerBlockSubmodules,
            get_num_layers_to_build,
        )

        spec = TransformerBlockSubmodules(
            layer_specs=[spec] * get_num_layers_to_build(config), layer_norm=SequenceParallelRMSNorm
        )
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=shape.padded_vocab_size,
        max_sequence_length=shape.max_position_embeddings,
        pre_process=first,
        post_process=last,
        parallel_output=True,
        share_embeddings_and_output_weights=shape.tie_word_embeddings and lm,
        # Packed: the core attention rotates the whole pack itself (rlcore_megatron.attention says why).
        position_embedding_type="none" if cfg.use_remove_padding else "rope",
        rotary_base=shape.rope_theta,
        rope_scaling=shape.rope_scaling_factor is not None,
        rope_scaling_factor=shape.rope_scaling_factor or 8.0,
    )
    if cfg.split_gate_up and cfg.transformer_impl == "local":
        # Dense SwiGLU MLPs: gate and up as two GEMMs on linear_fc1's halves (rlcore_megatron/mlp.py).
        from rlcore_megatron.mlp import use_split_gate_up

        use_split_gate_up(model)
    if shape.experts is not None and cfg.moe_grouped_gemm:
        from rlcore_megatron.experts import use_grouped_experts

        use_grouped_experts(model)
    if last and not lm:
        model.output_layer = ScalarHead(config, bias=head == "value")
    if last and lm and cfg.logits_chunk_size is not None:
        pass_hidden_through(model.output_layer, config)
    return model


def output_weight(model) -> torch.Tensor:
    """The last stage's vocabulary projection ``[V_padded/tp, h]``: the input embedding's when tied.

    Not megatron-core's ``shared_embedding_or_output_weight``, which returns the embedding on a first
    stage whether or not the two are tied (Qwen2.5-7B's output layer is its own matrix)."""
    if model.share_embeddings_and_output_weights:
        return model.shared_embedding_or_output_weight()
    return model.output_layer.weight


def pass_hidden_through(output_layer: torch.nn.Module, config: TransformerConfig) -> None:
    """Make the vocabulary output layer return its input (``[s, b, h]``, as the projection would see it)
    instead of the logits, so that the engine computes the head in chunks
    (:func:`rlcore_megatron.vocab_parallel.chunked_log_probs_and_entropy`). Its parameters stay where
    they are (names, checkpoints and the weight stream unchanged), and the input gets the communication
    the column-parallel projection would do: under sequence parallelism the sequence is gathered (the
    backward reduce-scatters), otherwise with tensor parallelism the backward sums the input's gradient
    over the ranks (each rank's vocabulary slice contributes a part)."""
    from rlcore_megatron.vocab_parallel import sum_grad_over_group

    def forward(hidden: torch.Tensor, weight=None, runtime_gather_output=None):
        if config.sequence_parallel:
            hidden = tensor_parallel.gather_from_sequence_parallel_region(
                hidden, tensor_parallel_output_grad=True
            )
        elif parallel_state.get_tensor_model_parallel_world_size() > 1:
            # Not megatron-core's copy_to_tensor_model_parallel_region: its backward all-reduces a
            # contiguous copy of the gradient and returns the original when that is not contiguous
            # (here it is a transposed view: GPTModel transposes its output), dropping the sum.
            hidden = sum_grad_over_group(hidden, parallel_state.get_tensor_model_parallel_group())
        return hidden, None

    output_layer.forward = forward


def cast_parameters(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Give every floating-point parameter ``dtype``.

    megatron-core's local norm layers are created in fp32 whatever ``params_dtype`` says (Megatron-LM
    casts the whole model through its ``Float16Module`` wrapper). Only parameters are cast: buffers
    such as rotary frequencies keep their fp32 precision.
    """
    for param in model.parameters():
        if param.is_floating_point() and param.dtype != dtype:
            param.data = param.data.to(dtype)


def mark_tensor_parallel(
    model: GPTModel, maps: list[ParamMap], layer_offset: int, expert_offset: int = 0
) -> None:
    """Tag tensor-parallel parameters as Megatron's own initialisation would.

    ``perform_initialization=False`` skips Megatron's weight init and, with it, the attributes that
    say which parameters are split over tensor-parallel ranks; without them the optimizer counts
    only TP rank 0's part of each split weight in the global gradient norm.
    """
    by_name = {pm.mcore: pm for pm in maps}
    for local_name, param in model.named_parameters():
        pm = by_name.get(local_to_global(local_name, layer_offset, expert_offset))
        if pm is not None and pm.tp_dim is not None and not hasattr(param, "tensor_model_parallel"):
            tensor_parallel.set_tensor_model_parallel_attributes(param, True, pm.tp_dim, 1)


def local_layers(model: GPTModel) -> list[int]:
    """Global indices of the decoder layers on this stage (Megatron numbers them from 1)."""
    return [layer.layer_number - 1 for layer in model.decoder.layers]

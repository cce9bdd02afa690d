"""``MegatronEngine``: rlcore's :class:`~rlcore.api.TrainEngine` on megatron-core.

One instance per rank. The model is built per pipeline stage from the HF ``config.json`` and filled from
the HF safetensors; tensor, pipeline and data parallelism come from megatron-core's process groups,
its DDP wrapper and (optionally) its distributed optimizer. Micro-batches run through Megatron's own
forward/backward schedules (1F1B with pipeline stages), with rlcore's loss function on the last stage.

Loss normalisation: the loss function divides by ``batch.meta["global_tokens"]`` itself, so the engine
makes Megatron *sum* gradients over micro-batches and data-parallel ranks (``calculate_per_token_loss``
with no token rescaling in :func:`_finalize_grads`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.distributed as dist
from megatron.core import parallel_state as mpu
from megatron.core import tensor_parallel
from megatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.pipeline_parallel import get_forward_backward_func
from rlcore.adapters import write_peft_adapter
from rlcore.api import Batch, DistInfo, EngineSpec, LossFn, TrainEngine, WeightBucket
from rlcore.kernels.logits import linear_log_probs
from rlcore.vision import is_vision_model
from rlcore.weights import bucketize
from transformers import AutoConfig

from rlcore_megatron import checkpoint, lora
from rlcore_megatron.architecture import model_shape
from rlcore_megatron.attention import PackedRotary, PackedSequences
from rlcore_megatron.compiled import compile_layers
from rlcore_megatron.config import MegatronConfig
from rlcore_megatron.convert import param_maps
from rlcore_megatron.experts import stacked_once
from rlcore_megatron.export import hf_named_tensors
from rlcore_megatron.handoffs import handoff_shape, known_shapes
from rlcore_megatron.hf_io import HFCheckpoint, load_into, write_hf_folder
from rlcore_megatron.model import (
    build_stage_model,
    cast_parameters,
    local_layers,
    mark_tensor_parallel,
    output_weight,
    param_dtype,
    transformer_config,
)
from rlcore_megatron.offload import Parking
from rlcore_megatron.optimizer import fuse_adam, install_device_norm
from rlcore_megatron.parallel import (
    broadcast_from_last_stage,
    gather_over_dp,
    init_process_groups,
    with_stage_layers,
)
from rlcore_megatron.routing import ExpertLoad
from rlcore_megatron.sequences import (
    Aligned,
    Packed,
    ResponseTokens,
    input_shape,
    micro_batch_rows,
    response_columns,
    restore,
    split_to_count,
    to_device,
)
from rlcore_megatron.vocab_parallel import chunked_log_probs_and_entropy, log_probs_and_entropy

HEAD_OUTPUTS = {"lm": ("log_probs", "entropy"), "value": ("values",), "score": ("scores",)}
#: Outputs of an engine with a LoRA adapter: the base model's log-probs (the adapter off), for the KL term.
LORA_OUTPUTS = ("base_log_probs",)
#: The folder inside an exported model folder that holds the PEFT adapter (as the FSDP engine writes it).
ADAPTER_FOLDER = "adapter"
TAGS = ("weights", "grads", "optimizer")


def _finalize_grads(model_chunks, num_tokens=None, *args, **kwargs):
    """Megatron's gradient finalisation (DP reduction, tied-embedding and sequence-parallel sums)
    without its division by the token count: rlcore's loss functions normalise already."""
    return finalize_model_grads(model_chunks, None, *args, **kwargs)


@attrs.frozen
class _Micro:
    """A micro-batch on the device, its left-aligned tokens and (``megatron.use_remove_padding``) the
    same tokens packed into one row with each token's rotary ``(cos, sin)``, each ``[T, 1, head_dim]``."""

    batch: Batch
    aligned: Aligned
    packed: Packed | None = None
    rotary: tuple[torch.Tensor, torch.Tensor] | None = None
    response: ResponseTokens | None = None
    #: A stand-in that only keeps this rank in step with the others (:meth:`MegatronEngine._split`): its
    #: loss counts zero and its outputs are dropped.
    ghost: bool = False

    def model_inputs(self) -> tuple[torch.Tensor, torch.Tensor, PackedSeqParams | None]:
        """``(input_ids, position_ids, packed_seq_params)`` for ``GPTModel``."""
        if self.packed is None:
            return self.aligned.tokens, self.aligned.position_ids, None
        p = self.packed
        params = PackedSequences(
            qkv_format="thd",
            cu_seqlens_q=p.cu_seqlens,
            cu_seqlens_kv=p.cu_seqlens,
            max_seqlen_q=p.max_seqlen,
            max_seqlen_kv=p.max_seqlen,
            rotary_cos=self.rotary[0],
            rotary_sin=self.rotary[1],
            cu_seqlens_host=p.cu_seqlens_host,
        )
        return p.tokens, p.position_ids, params

    def per_position(self, values: torch.Tensor) -> torch.Tensor:
        """Model outputs ``[b, L, ...]`` or packed ``[1, T, ...]`` -> ``[b, L, ...]`` on aligned positions."""
        return values if self.packed is None else self.packed.unpack(values, self.aligned)


@attrs.frozen
class _Plan:
    """A step's micro-batches: each one's model input shape (``[b, L]``, packed ``[1, T]``: from the host
    lengths, for the pipeline hand-offs) up front, and ``micros()``, which builds each micro-batch's inputs
    as Megatron's schedule asks for it. Building them one at a time overlaps the host's work on micro-batch
    ``k+1`` with the device's on ``k``; building all of them first kept the device idle at the start of each
    step (75 ms of a profiled 0.5B TP=2 step on an H100 host, for 9 micro-batches)."""

    shapes: list[tuple[int, int]]
    micros: Callable[[], Iterator[_Micro]]


#: Set on ``torch.cuda`` by this plugin's test redirect (``tests/mcore_cpu_redirect.py``), which runs
#: megatron-core on the CPU for CI; without it a CPU device is refused up front instead of failing deep in
#: megatron-core with "Torch not compiled with CUDA enabled".
CPU_REDIRECT_FLAG = "rlcore_megatron_cpu_redirect"


class MegatronEngine(TrainEngine):
    """megatron-core train engine: ``MegatronEngine(spec, config, platform, dist)``.

    Honours ``EngineSpec``: ``model_path``, ``head`` (``lm``/``value``/``score``), ``trainable``,
    ``dtype`` (float32/bfloat16), ``lr``, ``weight_decay``, ``betas``, ``grad_clip`` (0: no clipping),
    ``warmup_steps``, ``total_steps``, ``lr_schedule``, ``min_lr_ratio``, ``micro_batch_size``,
    ``max_tokens_per_micro_batch``, ``gradient_checkpointing`` (full recompute per layer),
    ``temperature``, ``seed`` and ``lora`` (a LoRA adapter on the decoder's linear layers, dense models
    without sequence parallelism: :mod:`rlcore_megatron.lora`).
    """

    config_class = MegatronConfig
    heads = tuple(HEAD_OUTPUTS)
    supports_lora = True

    def __init__(self, spec: EngineSpec, config: MegatronConfig | None, platform: Any, dist: DistInfo):
        super().__init__(spec, config if config is not None else MegatronConfig(), platform, dist)
        cfg = self.config
        if spec.head not in HEAD_OUTPUTS:
            raise ValueError(
                f"unknown head {spec.head!r}; the megatron engine supports {', '.join(HEAD_OUTPUTS)}"
            )
        if spec.freeze_vision_tower or is_vision_model(spec.model_path):
            what = "actor.freeze_vision_tower=true" if spec.freeze_vision_tower else f"{spec.model_path!r}"
            raise ValueError(
                f"{what}: the megatron engine trains text models only, not vision-language models "
                "(docs/vision.md says why); train them with --engine fsdp"
            )
        self.device = platform.set_device(dist.local_rank)
        if self.device.type == "cpu" and not getattr(torch.cuda, CPU_REDIRECT_FLAG, False):
            raise RuntimeError(
                "megatron engine: megatron-core needs an accelerator (it calls torch.cuda unconditionally) and "
                "this worker's device platform is the CPU; on a CPU machine train with --engine fsdp, or run "
                "on a GPU machine (trainer.device=auto picks it)"
            )
        # Inputs go through pinned memory (asynchronous copies) where there is an accelerator to pin for.
        self._pin = self.device.type != "cpu" and torch.accelerator.is_available()
        self.dtype = param_dtype(spec.dtype)
        self.hf_config = AutoConfig.from_pretrained(spec.model_path)
        self.shape = model_shape(
            self.hf_config,
            tp_size=cfg.tensor_model_parallel_size,
            pp_size=cfg.pipeline_model_parallel_size,
            make_vocab_size_divisible_by=cfg.make_vocab_size_divisible_by,
            ep_size=cfg.expert_model_parallel_size,
        )
        layout = init_process_groups(
            dist,
            platform.dist_backend,
            cfg.tensor_model_parallel_size,
            cfg.pipeline_model_parallel_size,
            cfg.expert_model_parallel_size,
        )
        # Megatron's RNG tracker: the same seed on every data-parallel replica, offset per TP rank.
        tensor_parallel.model_parallel_cuda_manual_seed(spec.seed)
        self.tf_config = transformer_config(
            self.shape, cfg, self.dtype, recompute=spec.gradient_checkpointing
        )
        # Sequence parallelism splits each micro-batch's sequence over the TP ranks: its length must divide.
        self._multiple = layout.tp_size if self.tf_config.sequence_parallel else 1
        #: Rotary angles of packed micro-batches (``megatron.use_remove_padding``), else None.
        self.rotary = (
            PackedRotary(self.tf_config, self.shape.rope_theta, self.shape.rope_scaling_factor)
            if cfg.use_remove_padding
            else None
        )
        module = build_stage_model(
            self.shape,
            cfg,
            self.tf_config,
            head=spec.head,
            first=layout.is_first_stage,
            last=layout.is_last_stage,
        )
        self.layout = with_stage_layers(layout, local_layers(module))
        self.maps = param_maps(
            self.shape, head=spec.head, fused_norms=cfg.transformer_impl == "transformer_engine"
        )
        stage = self.layout.stage_layers[self.layout.pp_rank]
        expert_offset = self.layout.expert_offset(self.shape)
        cast_parameters(module, self.dtype)
        mark_tensor_parallel(module, self.maps, stage[0] if stage else 0, expert_offset)
        #: Megatron names initialised here instead of loaded (a new critic's value head).
        self.fresh_params = load_into(
            module,
            self.maps,
            HFCheckpoint(spec.model_path),
            self.shape,
            layer_offset=stage[0] if stage else 0,
            tp_rank=self.layout.tp_rank,
            tp_size=self.layout.tp_size,
            init_missing=self._init_head,
            expert_offset=expert_offset,
        )
        #: The LoRA adapters of this stage (``spec.lora``), else None.
        self.adapters = (
            self._add_adapters(module, stage[0] if stage else 0) if spec.lora is not None else None
        )
        self.module = module.to(self.device)
        if cfg.compile:
            compile_layers(module)
        self.optimizer = self.scheduler = None
        if spec.trainable:
            self._setup_training()
        elif self.adapters is not None:
            raise ValueError("a LoRA adapter (EngineSpec.lora) needs a trainable engine")
        else:
            self.module.requires_grad_(False)
            self.model = self.module
        self.parking = Parking()
        self.steps = 0
        #: Tokens per expert in the last training step (mixtures of experts only).
        self.expert_load = None
        if self.shape.experts is not None:
            self.expert_load = ExpertLoad(
                self.module,
                self.shape.num_layers,
                self.shape.experts.num_experts,
                self.device,
                counts_here=self.layout.tp_rank == 0 or self.tf_config.sequence_parallel,
            )

    # -- construction ----------------------------------------------------------------------------
    def _add_adapters(self, module, layer_offset: int) -> lora.Adapters:
        """Freeze the loaded stage model and add the LoRA adapters (:mod:`rlcore_megatron.lora`)."""
        spec = self.spec
        lora.check_supported(
            spec.lora,
            self.shape,
            sequence_parallel=self.tf_config.sequence_parallel,
            impl=self.config.transformer_impl,
        )
        if {"gate_proj", "up_proj"} & set(lora.targeted_projections(spec.lora)):
            # The split MLP computes linear_fc1 from its weight directly (rlcore_megatron.mlp), past the
            # adapter: adapted MLPs keep megatron-core's class.
            from megatron.core.transformer.mlp import MLP

            from rlcore_megatron.mlp import SplitGateUpMLP

            for sub in module.modules():
                if type(sub) is SplitGateUpMLP:
                    sub.__class__ = MLP
        return lora.Adapters.add(
            module,
            spec.lora,
            self.shape,
            layer_offset=layer_offset,
            tp_rank=self.layout.tp_rank,
            tp_size=self.layout.tp_size,
            seed=spec.seed,
            dtype=self.dtype,
        )

    def _init_head(self, param: torch.Tensor) -> None:
        """A fresh scalar head: normal(0, initializer_range) weight, zero bias; same on every rank."""
        if param.dim() == 1:
            param.zero_()
            return
        gen = torch.Generator().manual_seed(self.spec.seed)
        param.copy_(torch.randn(param.shape, generator=gen) * self.shape.initializer_range)

    def _setup_training(self) -> None:
        spec, cfg = self.spec, self.config
        self.model = DistributedDataParallel(
            config=self.tf_config,
            ddp_config=DistributedDataParallelConfig(
                grad_reduce_in_fp32=cfg.grad_reduce_in_fp32,
                overlap_grad_reduce=cfg.overlap_grad_reduce,
                use_distributed_optimizer=cfg.use_distributed_optimizer,
                bucket_size=cfg.ddp_bucket_size,
            ),
            module=self.module,
        )
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=spec.lr,
                min_lr=spec.lr * spec.min_lr_ratio,
                weight_decay=spec.weight_decay,
                adam_beta1=spec.betas[0],
                adam_beta2=spec.betas[1],
                adam_eps=cfg.adam_eps,
                # An infinite threshold still computes the global norm (reported) but never clips.
                clip_grad=spec.grad_clip if spec.grad_clip > 0 else float("inf"),
                bf16=self.dtype == torch.bfloat16,
                params_dtype=self.dtype,
                use_distributed_optimizer=cfg.use_distributed_optimizer,
            ),
            [self.model],
            use_gloo_process_groups=False,
        )
        # Without Transformer Engine or Apex, megatron-core's fallbacks sync per parameter for the gradient
        # norm and run Adam unfused (rlcore_megatron.optimizer says what each costs).
        install_device_norm()
        if cfg.fused_optimizer:
            fuse_adam(self.optimizer)
        if spec.lr_schedule not in ("constant", "cosine"):
            raise ValueError(f"lr_schedule must be constant or cosine, got {spec.lr_schedule!r}")
        if spec.lr_schedule == "cosine" and spec.total_steps <= spec.warmup_steps:
            raise ValueError(
                f"a cosine schedule needs total_steps ({spec.total_steps}) > warmup_steps ({spec.warmup_steps})"
            )
        self.scheduler = OptimizerParamScheduler(
            self.optimizer,
            init_lr=0.0 if spec.warmup_steps > 0 else spec.lr,
            max_lr=spec.lr,
            min_lr=spec.lr * spec.min_lr_ratio,
            lr_warmup_steps=spec.warmup_steps,
            lr_decay_steps=max(spec.total_steps, spec.warmup_steps + 1),
            lr_decay_style=spec.lr_schedule,
            start_wd=spec.weight_decay,
            end_wd=spec.weight_decay,
            wd_incr_steps=1,
            wd_incr_style="constant",
        )
        self.tf_config.finalize_model_grads_func = _finalize_grads
        self.tf_config.no_sync_func = self.model.no_sync
        if cfg.overlap_grad_reduce:
            self.tf_config.grad_sync_func = self.model.start_grad_sync

    # -- placement -------------------------------------------------------------------------------
    def holds_output(self) -> bool:
        return self.layout.tp_rank == 0 and self.layout.is_last_stage

    def dp_rank_and_size(self) -> tuple[int, int]:
        return self.layout.dp_rank, self.layout.dp_size

    # -- forward / backward ----------------------------------------------------------------------
    def _prepare(self, batch: Batch) -> _Micro:
        """One micro-batch's inputs on the device."""
        # Only the chunked language-model head reads the response positions (_head_outputs); the others
        # skip that host work.
        responses = self.spec.head == "lm" and self.config.logits_chunk_size is not None
        batch, aligned, packed, response = to_device(
            batch, self.device, self._multiple, self.rotary is not None, self._pin, responses
        )
        rotary = None
        if packed is not None:
            # Once per micro-batch, for every layer of this stage (rlcore_megatron.attention says why).
            rotary = self.rotary(packed.position_ids[0], packed.max_seqlen, self.dtype)
        return _Micro(batch, aligned, packed, rotary, response)

    def _head_outputs(
        self, output: torch.Tensor, micro: _Micro, wanted: Sequence[str]
    ) -> dict[str, torch.Tensor]:
        """``output [b, L, V/tp]`` (logits) or ``[b, L, 1]`` (scalar head), packed ``[1, T, ...]`` with
        ``megatron.use_remove_padding`` -> the requested fields."""
        aligned = micro.aligned
        if self.spec.head == "score":
            scores = micro.per_position(output[..., 0])
            rows = torch.arange(scores.shape[0], device=output.device)
            return {"scores": scores[rows, (aligned.lengths - 1).clamp(min=0)].float()}
        if "responses" not in micro.batch:
            raise KeyError("the batch needs 'responses [b, R]' to place per-token outputs on the response")
        width = micro.batch["responses"].shape[1]
        if self.spec.head == "value":
            return {
                "values": response_columns(
                    restore(micro.per_position(output[..., 0].float()), aligned), width
                )
            }
        common = dict(
            vocab_size=self.shape.vocab_size,
            group=mpu.get_tensor_model_parallel_group() if self.layout.tp_size > 1 else None,
            temperature=self.spec.temperature,
            with_entropy="entropy" in wanted,
        )
        if self.config.logits_chunk_size is None:
            # megatron-core's logits, every position: log-probs where the logits are (packed: no padding
            # rows of vocabulary-wide logits), then placed.
            targets = aligned.next_tokens() if micro.packed is None else micro.packed.next_tokens()
            vocab_local = output.shape[-1]
            log_probs, entropy = log_probs_and_entropy(
                output, targets, vocab_start=self.layout.tp_rank * vocab_local, **common
            )
            out = {"log_probs": response_columns(restore(micro.per_position(log_probs), aligned), width)}
            if entropy is not None:
                out["entropy"] = response_columns(restore(micro.per_position(entropy), aligned), width)
            return out
        # ``output`` is the hidden state (model.pass_hidden_through): the head runs only on the positions
        # that predict response tokens.
        response = micro.response
        hidden = output.reshape(-1, output.shape[-1]).index_select(0, response.positions)
        if self.layout.tp_size == 1:
            # The whole vocabulary here: rlcore's fused head (one autograd function, fp32 statistics, the
            # vocabulary-wide elementwise work compiled with ``megatron.compile``), padded rows cut off.
            log_probs, entropy = linear_log_probs(
                hidden,
                output_weight(self.module)[: self.shape.vocab_size],
                None,
                response.targets,
                self.spec.temperature,
                self.config.logits_chunk_size,
                compiled=self.config.compile,
                keep_logits=not self.config.recompute_logits,
            )
            entropy = entropy if "entropy" in wanted else None
        else:  # vocabulary-parallel: each rank's slice in chunks, the softmax sums all-reduced
            weight = output_weight(self.module)
            log_probs, entropy = chunked_log_probs_and_entropy(
                hidden,
                weight,
                response.targets,
                chunk_tokens=self.config.logits_chunk_size,
                vocab_start=self.layout.tp_rank * weight.shape[0],
                compiled=self.config.compile,
                keep_logits=not self.config.recompute_logits,
                **common,
            )
        out = {"log_probs": response.place(log_probs)}
        if entropy is not None:
            out["entropy"] = response.place(entropy)
        return out

    def _run(self, plan: _Plan, forward_only: bool, reduce_fn) -> list[dict]:
        """Megatron's schedule over ``plan``'s micro-batches; ``reduce_fn(output, micro) -> (loss, info)``
        runs on the last stage. Returns the ``info`` dicts there (empty elsewhere)."""
        one = torch.ones((), dtype=torch.int, device=self.device)

        def forward_step(data_iterator, model):
            micro = next(data_iterator)
            input_ids, position_ids, packed_seq_params = micro.model_inputs()
            output = model(input_ids, position_ids, None, packed_seq_params=packed_seq_params)

            def loss_func(output_tensor):
                loss, info = reduce_fn(output_tensor, micro)
                return loss, one, info

            return output, loss_func

        # Each stage computes every hand-off's shape: no shape exchange, and no device sync, per hand-off.
        # Sequence parallelism splits each hand-off over the TP ranks as it splits the micro-batch.
        handoffs = [handoff_shape(shape, self.shape.hidden_size, self._multiple) for shape in plan.shapes]
        # No weight changes within the schedule: MoE layers stack their experts once for all micro-batches.
        with (
            known_shapes(handoffs) if self.layout.pp_size > 1 else contextlib.nullcontext(),
            stacked_once(self.module),
        ):
            return get_forward_backward_func()(
                forward_step_func=forward_step,
                data_iterator=plan.micros(),
                model=self.model,
                num_microbatches=len(plan.shapes),
                seq_length=max(shape[1] for shape in plan.shapes),
                micro_batch_size=max(shape[0] for shape in plan.shapes),
                forward_only=forward_only,
            )

    def _require(self, *tags: str) -> None:
        parked = [t for t in tags if self.parking.is_parked(t)]
        if parked:
            raise RuntimeError(f"engine state {parked} is released; call resume({parked}) first")

    def _split(self, batch: Batch, size: int) -> tuple[_Plan, list[int]]:
        """The micro-batches, planned, and the batch's rows in the order they hold them."""
        if len(batch) == 0:
            raise ValueError(
                f"data-parallel rank {self.layout.dp_rank} got an empty batch; dispatch at least "
                f"{self.layout.dp_size} rows (one per data-parallel rank)"
            )
        lengths = batch["attention_mask"].sum(1).tolist()
        packed = self.config.use_remove_padding
        rows = micro_batch_rows(lengths, size, self.spec.max_tokens_per_micro_batch, packed=packed)
        ghosts = 0
        if self.layout.ep_size > 1:
            # Each MoE layer exchanges tokens with the other data-parallel ranks: every rank must run as
            # many micro-batches as the one that planned most. A rank with fewer rows than that runs
            # ghosts (its first row again, loss zero, outputs dropped).
            most = torch.tensor(len(rows), device=self.device)
            dist.all_reduce(most, op=dist.ReduceOp.MAX, group=mpu.get_data_parallel_group())
            count = int(most)
            rows = split_to_count(rows, lengths, count)
            ghosts = count - len(rows)
        shapes = [input_shape([lengths[i] for i in r], self._multiple, packed) for r in rows]
        shapes += [input_shape(lengths[:1], self._multiple, packed)] * ghosts

        def micros() -> Iterator[_Micro]:
            yield from (self._prepare(batch.index(r)) for r in rows)
            for _ in range(ghosts):
                yield attrs.evolve(self._prepare(batch.index([0])), ghost=True)

        return _Plan(shapes=shapes, micros=micros), [i for r in rows for i in r]

    def train_step(self, batch: Batch, loss_fn: LossFn) -> dict[str, float]:
        if self.optimizer is None:
            raise RuntimeError("train_step on an engine built with trainable=False")
        self._require(*TAGS)
        plan, _ = self._split(batch, self.spec.micro_batch_size)  # order is irrelevant to a sum
        wanted = HEAD_OUTPUTS[self.spec.head]

        routed = self._routed_tokens(plan)

        def reduce_fn(output, micro):
            loss, metrics = loss_fn(self._head_outputs(output, micro, wanted), micro.batch)
            if micro.ghost:  # a zero loss still runs the backward, and its all-to-alls, in step
                return loss * 0.0, {}
            # Kept as tensors until the step ends: no device sync inside the pipeline schedule.
            return loss if routed is None else loss * routed, {"loss": loss.detach(), **metrics}

        # With router losses, every loss's gradient is scaled by 1 / routed (the policy loss above was
        # multiplied by it, so its gradient is unchanged; _routed_tokens says why).
        self.tf_config.grad_scale_func = None if routed is None else (lambda t: t / routed)
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        lr = float(self.optimizer.param_groups[0]["lr"])
        if self.expert_load is not None:
            self.expert_load.reset()
        infos = self._run(plan, forward_only=False, reduce_fn=reduce_fn)
        stepped, grad_norm, _ = self.optimizer.step()
        if stepped:
            self.scheduler.step(increment=1)
        self.steps += 1
        metrics = self._reduce_metrics(infos)
        # The norm is a device tensor with the local kernels (rlcore_megatron.optimizer), a float otherwise.
        metrics.update(grad_norm=float(grad_norm) if grad_norm is not None else 0.0, lr=lr)
        if self.expert_load is not None:
            metrics.update(self.expert_load.metrics())
        return metrics

    def _routed_tokens(self, plan: _Plan) -> float | None:
        """Tokens this step routes through each MoE layer, over every data-parallel rank; None without
        router losses.

        megatron-core adds each micro-batch's load-balancing (and z-) loss multiplied by the micro-batch's
        token count, expecting every gradient to be divided by the step's token count afterwards (its
        per-token-loss convention). rlcore's loss functions normalise themselves, so the engine scales
        only through ``grad_scale_func``: the router losses then enter as their token-weighted mean over
        the step's micro-batches, times their coefficients, whatever the micro-batch split."""
        cfg = self.tf_config
        if self.shape.experts is None or not (cfg.moe_aux_loss_coeff or cfg.moe_z_loss_coeff):
            return None
        tokens = torch.tensor(float(sum(b * n for b, n in plan.shapes)), device=self.device)
        if self.layout.dp_size > 1:
            dist.all_reduce(tokens, group=mpu.get_data_parallel_group())
        return float(tokens)

    def _reduce_metrics(self, infos: list[dict]) -> dict[str, float]:
        """Sum ``loss`` (already globally normalised) over micro-batches and DP ranks; average the
        rest. The last stage holds them; every rank returns the same dict."""
        local = None
        if self.layout.is_last_stage:
            keys = {k for info in infos for k in info}
            local = {k: [float(info[k]) for info in infos if k in info] for k in keys}
        local = broadcast_from_last_stage(local, self.layout)
        merged: dict[str, list[float]] = {}
        for part in gather_over_dp(local, self.layout):
            for k, values in part.items():
                merged.setdefault(k, []).extend(values)
        return {k: sum(v) if k == "loss" else sum(v) / len(v) for k, v in merged.items()}

    @torch.no_grad()
    def infer(self, batch: Batch, outputs: Sequence[str] = ("log_probs",)) -> Batch | None:
        """See :meth:`rlcore.api.TrainEngine.infer`. With a LoRA adapter, ``base_log_probs`` are the frozen
        base model's log-probs (the adapter off)."""
        if isinstance(outputs, str):
            outputs = [outputs]
        base = [o for o in outputs if o in LORA_OUTPUTS]
        if base and self.adapters is None:
            raise ValueError(
                f"infer outputs {base} need a LoRA adapter (EngineSpec.lora); this engine has none"
            )
        unknown = [o for o in outputs if o not in HEAD_OUTPUTS[self.spec.head] and o not in LORA_OUTPUTS]
        if unknown:
            raise ValueError(
                f"head {self.spec.head!r} computes {', '.join(HEAD_OUTPUTS[self.spec.head])}, not {unknown}"
            )
        self._require("weights")
        adapted = [o for o in outputs if o not in LORA_OUTPUTS]
        result = self._infer(batch, adapted) if adapted else None
        if base:
            with self.adapters.disabled():
                plain = self._infer(batch, ["log_probs"])
            if plain is not None:
                extra = {"base_log_probs": plain["log_probs"]}
                result = Batch({**(dict(result.tensors) if result is not None else {}), **extra})
        return result

    def _infer(self, batch: Batch, outputs: Sequence[str]) -> Batch | None:
        plan, order = self._split(batch, self.config.infer_micro_batch_size or self.spec.micro_batch_size)
        zero = torch.zeros((), device=self.device)

        def reduce_fn(output, micro):
            return zero, {} if micro.ghost else self._head_outputs(output, micro, outputs)

        infos = [info for info in self._run(plan, forward_only=True, reduce_fn=reduce_fn) if info]
        if not self.holds_output():
            return None
        back = torch.empty(len(order), dtype=torch.long)
        back[torch.tensor(order)] = torch.arange(len(order))  # micro-batch order -> the batch's
        return Batch({k: torch.cat([info[k] for info in infos]).cpu()[back] for k in outputs})

    # -- weights ---------------------------------------------------------------------------------
    def _named_hf(self, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
        """The model in HF names; with a LoRA adapter the merged weights ``W + scale * B A`` (in fp32,
        cast once to ``dtype``)."""
        self._require("weights")
        value = self.adapters.merged_value() if self.adapters is not None else None
        return hf_named_tensors(self.module, self.maps, self.shape, self.layout, dtype, self.device, value)

    def _adapter_hf(self, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
        """The LoRA adapter in HF/PEFT names (:func:`rlcore.adapters.adapter_name`); collective."""
        if self.adapters is None:
            raise NotImplementedError(
                "export_adapter: this megatron engine trains no LoRA adapter (EngineSpec.lora)"
            )
        self._require("weights")
        named = hf_named_tensors(
            self.module, self.adapters.maps(), self.shape, self.layout, dtype, self.device
        )
        return self.adapters.exported(named)

    def _stream(self, named, dtype: torch.dtype, bucket_bytes: int) -> Iterator[WeightBucket]:
        """``named`` in buckets where this rank :meth:`holds_output`; elsewhere only iterated (it drives
        the collectives)."""
        if self.holds_output():
            yield from bucketize(named, bucket_bytes, dtype)
        else:
            for _ in named:
                pass

    def export_adapter(self, dtype: torch.dtype, bucket_bytes: int) -> Iterator[WeightBucket]:
        yield from self._stream(self._adapter_hf(dtype), dtype, bucket_bytes)

    def export_weights(self, dtype: torch.dtype, bucket_bytes: int) -> Iterator[WeightBucket]:
        yield from self._stream(self._named_hf(dtype), dtype, bucket_bytes)

    def export_hf(self, path: str) -> None:
        named = self._named_hf(self.dtype)
        tied = {alias for pm in self.maps for alias in pm.aliases}
        if self.holds_output() and self.layout.dp_rank == 0:
            updates: dict[str, Any] = {"dtype": self.spec.dtype}
            if self.spec.head != "lm":
                arch = (self.hf_config.architectures or ["ForCausalLM"])[0].replace("ForCausalLM", "")
                suffix = (
                    "ForTokenClassification" if self.spec.head == "value" else "ForSequenceClassification"
                )
                updates.update(architectures=[arch + suffix], num_labels=1)
            # Tied weights are stored once, as save_pretrained does.
            write_hf_folder(
                path, ((n, t) for n, t in named if n not in tied), self.spec.model_path, dict(updates)
            )
        else:
            for _ in named:
                pass
        if self.adapters is not None:
            # Beside the merged weights, the adapter as PEFT saves it (peft.PeftModel.from_pretrained).
            adapter = {n: t.cpu() for n, t in self._adapter_hf(self.dtype)}
            if self.holds_output() and self.layout.dp_rank == 0:
                write_peft_adapter(Path(path) / ADAPTER_FOLDER, adapter, self.spec.lora, self.spec.model_path)
        dist.barrier()

    # -- memory ----------------------------------------------------------------------------------
    def _tensors(self, tag: str) -> list[torch.Tensor]:
        params = list(self.module.parameters())
        if tag == "weights":
            return params
        if tag == "grads":
            return [p.main_grad for p in params if getattr(p, "main_grad", None) is not None]
        out = []
        for inner in getattr(
            self.optimizer, "chained_optimizers", [self.optimizer] if self.optimizer else []
        ):
            for state in inner.optimizer.state.values():
                out.extend(v for v in state.values() if torch.is_tensor(v) and v.device == self.device)
            # fp32 master copies of bf16 weights (fp32 weights are their own master copy: "weights").
            for groups in ("shard_fp32_from_float16_groups", "fp32_from_float16_groups"):
                out.extend(t for group in getattr(inner, groups, []) for t in group)
        return out

    def _check_tags(self, tags: Sequence[str]) -> None:
        unknown = [t for t in tags if t not in TAGS]
        if unknown:
            raise ValueError(f"unknown memory tags {unknown}; the megatron engine releases {', '.join(TAGS)}")

    def release(self, tags: Sequence[str]) -> None:
        self._check_tags(tags)
        for tag in tags:
            self.parking.park(tag, self._tensors(tag), keep_values=tag != "grads")
        self.platform.empty_cache()

    def resume(self, tags: Sequence[str]) -> None:
        self._check_tags(tags)
        for tag in tags:
            self.parking.unpark(tag)

    # -- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(self, path: str) -> None:
        self._require(*TAGS)
        common = {"steps": self.steps, "lora_rank": self.spec.lora.rank if self.spec.lora is not None else 0}
        if self.scheduler is not None:
            common["scheduler"] = self.scheduler.state_dict()
        checkpoint.save(path, self.module, self.optimizer, common)

    def load_checkpoint(self, path: str) -> None:
        self._require(*TAGS)
        mine = self.spec.lora.rank if self.spec.lora is not None else 0
        saved = checkpoint.common(path).get("lora_rank", 0)
        if saved != mine:
            raise ValueError(
                f"checkpoint {path} was written with actor.lora.rank={saved}, but this run has "
                f"actor.lora.rank={mine}; resume with the checkpoint's LoRA settings"
            )
        common = checkpoint.load(path, self.module, self.optimizer)
        self.steps = common["steps"]
        if self.scheduler is not None:
            self.scheduler.load_state_dict(common["scheduler"])

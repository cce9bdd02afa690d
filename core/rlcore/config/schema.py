"""The config tree of a run: attrs classes, one per section, each field documented with ``#:``.

Plugin sections (``fsdp:``, ``vllm:``, ``megatron:`` ...) are not named here: the selected engines'
plugins contribute their classes at load time (:mod:`rlcore.config.loader`).
"""

from __future__ import annotations

from typing import Any

import attrs

from rlcore.agents.config import AgentConfig
from rlcore.data.config import DataConfig
from rlcore.distill.config import TeacherConfig
from rlcore.envs.config import EnvironmentsConfig
from rlcore.rewards.config import RewardConfig
from rlcore.rewards.model_config import RewardModelConfig
from rlcore.sandbox.config import SandboxConfig


class FieldValueError(ValueError):
    """A field's value failed its check; ``field`` lets the loader name the full key path."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def _one_of(*allowed: str):
    def check(instance: Any, attribute: attrs.Attribute, value: str) -> None:
        if value not in allowed:
            raise FieldValueError(attribute.name, f"must be one of {', '.join(allowed)}; got {value!r}")

    return check


def _non_negative(instance: Any, attribute: attrs.Attribute, value: int) -> None:
    if value < 0:
        raise FieldValueError(attribute.name, f"must be >= 0, got {value!r}")


def _at_least_minus_one(instance: Any, attribute: attrs.Attribute, value: int) -> None:
    if value < -1:
        raise FieldValueError(attribute.name, f"must be >= -1 (-1: never), got {value!r}")


def _auto_or_non_negative(instance: Any, attribute: attrs.Attribute, value: float | str | None) -> None:
    if (
        value is None
        or value == "auto"
        or (isinstance(value, float | int) and not isinstance(value, bool) and value >= 0)
    ):
        return
    raise FieldValueError(attribute.name, f"must be 'auto', a number >= 0 or null, got {value!r}")


def _optional_non_negative(instance: Any, attribute: attrs.Attribute, value: float | None) -> None:
    if value is not None and value < 0:
        raise FieldValueError(attribute.name, f"must be >= 0 or null, got {value!r}")


def _positive(instance: Any, attribute: attrs.Attribute, value: int | None) -> None:
    if value is not None and value < 1:
        raise FieldValueError(attribute.name, f"must be >= 1, got {value!r}")


@attrs.define(kw_only=True)
class ModelConfig:
    """The policy model. ``builtin:tiny`` is a tiny Qwen2 model made locally on first use;
    ``builtin:smollm2-135m-instruct`` a real pretrained one from a registry package (:mod:`rlcore.models`)."""

    #: Hugging Face model folder (local path), hub id, or a built-in model (``builtin:tiny``,
    #: ``builtin:smollm2-135m-instruct``).
    path: str = "builtin:tiny"
    #: Tokenizer folder; defaults to ``path``.
    tokenizer_path: str | None = None
    #: Parameter dtype of the trainer, and of the rollout unless ``rollout.dtype`` says otherwise.
    dtype: str = attrs.field(default="float32", validator=_one_of("float32", "bfloat16", "float16"))


@attrs.define(kw_only=True)
class OptimConfig:
    """AdamW and its learning-rate schedule."""

    #: Peak learning rate.
    lr: float = 1e-6
    #: Decoupled weight decay.
    weight_decay: float = 0.0
    #: Adam betas.
    betas: tuple[float, float] = (0.9, 0.999)
    #: Max global gradient norm (0 disables clipping).
    grad_clip: float = 1.0
    #: Linear warm-up steps.
    warmup_steps: int = 0
    #: ``constant`` or ``cosine`` (decays to ``min_lr_ratio * lr`` at ``trainer.total_steps``).
    lr_schedule: str = attrs.field(default="constant", validator=_one_of("constant", "cosine"))
    #: Final learning rate as a fraction of ``lr`` for the cosine schedule.
    min_lr_ratio: float = 0.0


def _target_modules(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value == "all-linear":
        return
    if not isinstance(value, list | tuple) or not value or not all(isinstance(v, str) and v for v in value):
        raise FieldValueError(
            attribute.name, f"must be 'all-linear' or a non-empty list of module names, got {value!r}"
        )


def _dropout(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise FieldValueError(attribute.name, f"must be in [0, 1), got {value!r}")


@attrs.define(kw_only=True)
class LoraConfig:
    """A LoRA adapter trained instead of the full policy (PEFT on the FSDP engine, its own on the Megatron
    engine: dense models, no sequence parallelism). The base weights stay
    frozen; the reference policy is the base with the adapter switched off, so no second model is loaded;
    checkpoints hold the adapter; rollouts that serve adapters (vLLM on GPUs) receive the adapter alone at each
    sync, others the merged weights."""

    #: Adapter rank; 0 trains the full model (no adapter).
    rank: int = attrs.field(default=0, validator=_non_negative)
    #: Scaling numerator: the update is ``(alpha / rank) * B A``.
    alpha: float = 16.0
    #: Linear layers to adapt, by module name (``[q_proj, v_proj]``), or ``all-linear`` (every linear
    #: layer of the decoder blocks).
    target_modules: Any = attrs.field(default="all-linear", validator=_target_modules)
    #: Dropout on the adapter's input in the training forward. Above 0 the training forward differs
    #: from the log-prob forward, so importance ratios start away from 1 (PEFT's default is 0 too).
    dropout: float = attrs.field(default=0.0, validator=_dropout)
    #: What each weight sync sends: ``adapter`` (the adapter alone; the rollout engine must load adapters),
    #: ``merged`` (``W + (alpha / rank) B A``, any rollout), or ``auto``: the adapter where the rollout engine
    #: serves it well, else merged (vLLM: on GPUs in bf16/fp16; its CPU build serves adapters through slow
    #: reference kernels and its GPU kernels take no fp32, so those take merged weights).
    sync: str = attrs.field(default="auto", validator=_one_of("auto", "adapter", "merged"))


@attrs.define(kw_only=True)
class ActorConfig:
    """The policy being trained (also sizes the reference model, which shares its engine)."""

    #: Ranks of the train engine (data x tensor x pipeline parallel).
    world_size: int = attrs.field(default=1, validator=_positive)
    #: Optimizer settings.
    optim: OptimConfig = attrs.Factory(OptimConfig)
    #: Prompts per optimizer step (each carries ``rollout.n`` responses); ``None``: the whole batch.
    ppo_mini_batch_size: int | None = attrs.field(default=None, validator=_positive)
    #: Passes over each batch.
    ppo_epochs: int = attrs.field(default=1, validator=_positive)
    #: Sequences per forward/backward on one rank. ``None`` (and no ``max_tokens_per_micro_batch``):
    #: micro-batches by a token budget the worker sizes from its device's memory and the model's shape.
    micro_batch_size: int | None = attrs.field(default=None, validator=_positive)
    #: Token budget per micro-batch (dynamic micro-batches); wins over ``micro_batch_size``.
    max_tokens_per_micro_batch: int | None = attrs.field(default=None, validator=_positive)
    #: Recompute activations in backward to save memory.
    gradient_checkpointing: bool = False
    #: The actor's forward over the batch before its update (``old_log_probs``, ``timing/old_log_probs``).
    #: ``auto``: skipped when the update is on-policy, one optimizer step over the whole batch
    #: (``ppo_epochs: 1``, ``ppo_mini_batch_size`` unset or covering the batch) with nothing reading old
    #: log-probs before it (no KL penalty in the reward): the loss then takes its own forward's detached
    #: log-probs, the same numbers. ``always``: run the pass every step.
    recompute_old_log_probs: str = attrs.field(default="auto", validator=_one_of("auto", "always"))
    #: Train a LoRA adapter instead of the full weights (``lora.rank > 0``).
    lora: LoraConfig = attrs.Factory(LoraConfig)
    #: A vision-language model's vision tower (its image encoder and the merger into the language model)
    #: stays at its loaded weights; the language model trains (verl's ``actor.freeze_vision_tower``).
    freeze_vision_tower: bool = False


@attrs.define(kw_only=True)
class CriticConfig:
    """The value model (PPO with GAE). Its engine is the train engine of the run."""

    #: Model folder for the critic; ``None``: the policy model with a value head.
    model_path: str | None = None
    #: Ranks of the critic's train engine.
    world_size: int = attrs.field(default=1, validator=_positive)
    #: Optimizer settings.
    optim: OptimConfig = attrs.Factory(lambda: OptimConfig(lr=1e-5))
    #: Passes over each batch.
    ppo_epochs: int = attrs.field(default=1, validator=_positive)
    #: Sequences per forward/backward on one rank; ``None``: by a token budget sized from the device's
    #: memory and the model's shape, as for the actor.
    micro_batch_size: int | None = attrs.field(default=None, validator=_positive)
    #: Value clipping range around the old values.
    cliprange_value: float = 0.5


@attrs.define(kw_only=True)
class RolloutConfig:
    """Generation: which rollout engine and how it samples."""

    #: Rollout engine plugin (``vllm``, ``sglang``, ``hf`` ...); ``auto``: the device platform's choice
    #: (on GPUs vLLM when installed, else hf; on CPUs hf, which measured faster there); the run's log
    #: says which and why.
    engine: str = "auto"
    #: Parameter dtype of the rollout engine, and of the weight stream to it; ``null``: ``model.dtype``.
    #: ``bfloat16`` with an fp32 trainer (``model.dtype: float32`` and the engine's bf16 mixed precision)
    #: is verl's usual setting: the trainer keeps fp32 master weights, generation runs in bf16, and the
    #: rollout's log-probs differ from the trainer's by bf16 rounding (the post-sync check reports it).
    #: ``auto``: that setting where the device platform takes the fast path (GPUs), ``model.dtype``
    #: elsewhere (CPUs); the run's log says which.
    dtype: str | None = attrs.field(
        default="auto",
        validator=attrs.validators.optional(_one_of("auto", "float32", "bfloat16", "float16")),
    )
    #: ``fp8``: the rollout engine generates with float8 (e4m3) weights in its linear layers (vLLM's
    #: online per-tensor and SGLang's per-channel FP8, W8A8 with dynamic activation scales on GPUs), over
    #: a trainer in ``model.dtype``: the weight stream stays in ``rollout.dtype`` and the engine
    #: quantizes it again at every sync. The sampling distribution then differs from the trainer's more
    #: than bf16 alone: ``algorithm.off_policy: auto`` picks ``tis`` with it, and the post-sync check
    #: bounds it by the fp8 cap (docs/concepts.md). ``null``: weights in ``rollout.dtype``.
    quantization: str | None = attrs.field(default=None, validator=attrs.validators.optional(_one_of("fp8")))
    #: Responses sampled per prompt (the group size of GRPO/RLOO).
    n: int = attrs.field(default=4, validator=_positive)
    #: Sampling temperature (0: greedy).
    temperature: float = 1.0
    #: Nucleus sampling mass (1: off).
    top_p: float = 1.0
    #: Top-k filter (-1: off).
    top_k: int = -1
    #: Longest response in tokens.
    max_response_length: int = attrs.field(default=256, validator=_positive)
    #: Strings that end a response when generated, besides the end-of-sequence token.
    stop: list[str] = attrs.Factory(list)
    #: Rollout engine replicas.
    num_engines: int = attrs.field(default=1, validator=_positive)
    #: Devices per replica.
    tensor_parallel_size: int = attrs.field(default=1, validator=_positive)
    #: Fraction of device memory the engine may take (GPU).
    gpu_memory_utilization: float = 0.5
    #: Temperature for validation (0: greedy).
    val_temperature: float = 0.0
    #: Responses per validation prompt.
    val_n: int = attrs.field(default=1, validator=_positive)


@attrs.define(kw_only=True)
class KLControlConfig:
    """KL-in-reward coefficient control (``fixed`` or ``adaptive``, Ziegler et al. 2019)."""

    #: ``fixed`` or ``adaptive``.
    type: str = attrs.field(default="fixed", validator=_one_of("fixed", "adaptive"))
    #: Initial (or fixed) coefficient.
    kl_coef: float = 0.001
    #: Target KL of the adaptive controller.
    target_kl: float = 0.1
    #: Horizon of the adaptive controller.
    horizon: int = 10000


@attrs.define(kw_only=True)
class AlgorithmConfig:
    """The RL algorithm: a preset name; any other field left ``None`` takes the preset's value."""

    #: Preset: ``grpo``, ``ppo``, ``dapo``, ``rloo``, ``reinforce_plus_plus``, ``gspo``, ``remax``,
    #: ``opd`` (on-policy distillation from the ``teacher:`` model) ...
    name: str = "grpo"
    #: Advantage estimator (``gae``, ``grpo``, ``rloo`` ...; see docs/algorithms.md).
    adv_estimator: str | None = None
    #: GRPO: divide by the group's reward std (False gives Dr.GRPO).
    norm_adv_by_std_in_grpo: bool | None = None
    #: GAE discount.
    gamma: float = 1.0
    #: GAE lambda.
    lam: float = 1.0
    #: Policy loss (``vanilla``, ``gspo``, ``cispo`` ...).
    policy_loss: str | None = None
    #: ``token-mean``, ``seq-mean-token-sum``, ``seq-mean-token-mean``, ``seq-mean-token-sum-norm``.
    loss_agg_mode: str | None = None
    #: Symmetric PPO clip range (used where ``clip_ratio_low/high`` are unset).
    clip_ratio: float | None = None
    #: Lower clip range (``1 - clip_ratio_low``).
    clip_ratio_low: float | None = None
    #: Upper clip range (``1 + clip_ratio_high``; DAPO's clip-higher).
    clip_ratio_high: float | None = None
    #: Dual-clip bound for negative advantages.
    clip_ratio_c: float | None = None
    #: Entropy bonus coefficient.
    entropy_coeff: float | None = None
    #: Add a KL(policy || reference) term to the actor loss.
    use_kl_loss: bool | None = None
    #: Coefficient of the KL loss.
    kl_loss_coef: float | None = None
    #: Estimator of the KL loss (``kl``, ``abs``, ``mse``, ``low_var_kl``, with ``+`` variants).
    kl_loss_type: str | None = None
    #: Subtract a KL penalty from the reward instead.
    use_kl_in_reward: bool | None = None
    #: Estimator of the in-reward KL penalty.
    kl_penalty: str | None = None
    #: Coefficient control of the in-reward KL penalty.
    kl_ctrl: KLControlConfig = attrs.Factory(KLControlConfig)
    #: On-policy distillation (``name: opd``): weight of the per-token reverse KL to the teacher in the
    #: advantage, ``opd_kl_coef * (log p_teacher - log p_student)`` (preset: 1).
    opd_kl_coef: float | None = attrs.field(default=None, validator=_optional_non_negative)
    #: On-policy distillation: weight of the task reward's advantage (``adv_estimator``'s, GRPO's group
    #: baseline by default) added to the distillation advantage; 0 distils alone (preset: 0).
    opd_reward_weight: float | None = attrs.field(default=None, validator=_optional_non_negative)
    #: Off-policy correction of samples the rollout drew under older weights (docs/async.md):
    #: ``none``; ``behaviour`` (PPO's ratio centred on the rollout's own log-probs, no old-log-prob pass);
    #: ``decoupled`` (AReaL's decoupled PPO: the ratio centred on the actor's weights before the update,
    #: times ``pi_prox / pi_behav``, tokens above ``is_cap`` dropped); ``tis`` (truncated importance
    #: sampling, verl's ``rollout_is``: that weight capped at ``is_cap``); ``mask`` (no reweighting, the
    #: tokens or, at ``is_level: sequence``, the sequences whose weight exceeds ``is_cap`` dropped: TRL's
    #: default ``sequence_mask`` at 3). ``auto``: ``tis`` when samples can be stale (``trainer.mode``
    #: ``one_step_off``, or ``async`` with ``max_staleness`` > 0) or the rollout quantizes
    #: (``rollout.quantization``), else ``none`` (why: docs/concepts.md).
    off_policy: str = attrs.field(
        default="auto", validator=_one_of("auto", "none", "behaviour", "decoupled", "tis", "mask")
    )
    #: The importance-weight cap of ``tis`` (truncation) and ``decoupled`` (drop); ``None``: no cap.
    is_cap: float | None = 2.0
    #: ``token``: one importance weight per token; ``sequence``: the product over the response (``tis``, ``mask``).
    is_level: str = attrs.field(default="token", validator=_one_of("token", "sequence"))


@attrs.define(kw_only=True)
class TransportConfig:
    """How weights travel from the trainer to the rollout engines."""

    #: ``auto`` (``inprocess`` when trainer and rollout share a process; ``ipc`` when colocated on GPUs of
    #: one node: device buffers shared by handle; else ``ray``), ``inprocess``, ``ray``, ``broadcast``,
    #: ``ipc``; plugins add more (rlcore-sglang: ``sglang-distributed``, NCCL straight into SGLang's
    #: scheduler, for ``trainer.placement: split``).
    name: str = "auto"
    #: Bucket size of the weight stream in bytes.
    bucket_bytes: int = attrs.field(default=256 * 2**20, validator=_positive)
    #: Seconds a collective transport (``broadcast``) waits for its peers inside a worker (a torch
    #: process-group timeout: the worker's call raises). Each phase of every sync is also a worker call,
    #: bounded from the driver by ``trainer.call_timeout_s``, whichever comes first.
    timeout_s: float = 600.0
    #: Fail the run when the post-sync check's trimmed mean |trainer - rollout| log-prob exceeds this.
    #: ``auto``: calibrated on the run: the initial sync (same weights on both sides) measures the pair's
    #: floor, which must stay under the dtype's cap (float32/float64 0.02, float16 0.1, bfloat16 0.3); each
    #: later sync is bound by ``min(max(3 * floor, floor + margin), cap)`` (margin 0.005 fp32, 0.2 bf16;
    #: docs/concepts.md). A number: that bound at every sync; ``null``: report only.
    max_logprob_diff: float | str | None = attrs.field(default="auto", validator=_auto_or_non_negative)
    #: Probe prompts for the post-sync check (0 disables it).
    check_prompts: int = 2
    #: Run the post-sync check on the first two syncs (the initial weights and the first trained ones:
    #: where a layout or cache bug shows) and then at every step divisible by this (1: every sync). In
    #: between, ``rollout/logprob_diff_mean`` still compares rollout and trainer log-probs every step.
    check_interval: int = attrs.field(default=10, validator=_positive)


def _data_files(instance: Any, attribute: attrs.Attribute, value: list[str]) -> None:
    from rlcore.data.files import SUPPORTED_SUFFIXES

    for i, path in enumerate(value):
        if not path.lower().endswith(SUPPORTED_SUFFIXES):
            raise FieldValueError(
                attribute.name, f"[{i}] = {path!r} is not a {', '.join(SUPPORTED_SUFFIXES)} file"
            )


@attrs.define(kw_only=True)
class SFTConfig:
    """Supervised fine-tuning data: the warm-up before RL (``trainer.warmup_sft_steps``) trains the
    actor on it with the actor's own engine and optimizer (see :mod:`rlcore.trainer.sft`)."""

    #: Files of rows with ``prompt`` (chat messages, as in ``data.train_files``) and a response text
    #: (parquet or jsonl); ``builtin:<task>/sft.jsonl`` for a built-in task's answers.
    files: list[str] = attrs.field(factory=list, validator=_data_files)
    #: Column holding the response text the model is trained to write (an end-of-sequence token follows).
    response_key: str = "response"
    #: Examples per optimizer step.
    batch_size: int = attrs.field(default=32, validator=_positive)
    #: Longest response in tokens (end-of-sequence included); a longer one is an error naming its row.
    max_response_length: int = attrs.field(default=1024, validator=_positive)


@attrs.define
class StreamConfig:
    """``trainer.mode: stream``: the rollout stream that outlives a step (docs/async.md)."""

    #: Groups in flight beyond the training batch (``null``: one more batch, ``data.train_batch_size``, as
    #: verl's one-pool mode keeps the next batch in flight). 0: only the batch; nothing is carried over.
    over_sampling: int | None = attrs.field(default=None, validator=attrs.validators.optional(_non_negative))
    #: Which finished groups a step trains on: a registered stream policy (``fifo``: oldest admitted
    #: first; ``finish_order``: the first to finish). Plugins add more (hook ``register_stream_policies``).
    policy: str = "fifo"


@attrs.define(kw_only=True)
class TrainerConfig:
    """The run: length, placement, logging, checkpoints."""

    #: Training steps (each: generate, score, update).
    total_steps: int = attrs.field(default=30, validator=_positive)
    #: Supervised warm-up of the actor on ``sft.files`` before the first RL step (0: none); validation
    #: runs before and after it.
    warmup_sft_steps: int = attrs.field(default=0, validator=_non_negative)
    #: Seed of everything seeded (data order, sampling, model init of built-ins).
    seed: int = 0
    #: ``auto`` picks the best available device platform; or a platform name (``cpu``, ``cuda`` ...).
    device: str = "auto"
    #: ``colocated`` (roles time-share devices), ``split`` (rollout on its own devices) or ``hybrid``
    #: (colocated, and each rollout replica built inside an actor rank's process, as verl's hybrid
    #: engine: its weights are loaded in memory, without a transport or a trip through the driver;
    #: ``rollout.num_engines`` at most ``actor.world_size``, ``rollout.tensor_parallel_size`` 1).
    #: ``auto``: ``hybrid`` for the HF rollout where that layout applies (synchronous mode, no named
    #: transport), else ``colocated``; the run's log says which and why.
    placement: str = attrs.field(default="auto", validator=_one_of("auto", "colocated", "split", "hybrid"))
    #: ``sync``: each step generates, then trains, then syncs weights. ``one_step_off``: the rollout
    #: generates the next step's batch with the previous weights while the actor trains on this one
    #: (``max_staleness`` 1). ``async``: the rollout generates ahead of the trainer by up to
    #: ``max_staleness`` policy versions, and with ``partial_rollout`` responses continue across weight
    #: updates. Both overlapping modes need the rollout on devices of its own (``placement: split``) where
    #: devices have memory apart from the host's (docs/async.md).
    #: ``stream``: rollouts outlive a step: requests stay in flight across steps, a step trains on the first
    #: ``data.train_batch_size`` groups to finish (``trainer.stream``) and unfinished ones continue under the
    #: new weights; it runs on one shared pool (colocated or hybrid placement, GPUs included).
    mode: str = attrs.field(default="sync", validator=_one_of("sync", "one_step_off", "async", "stream"))
    #: ``async`` and ``stream``: how many policy versions a trained sample may lag the weights being updated
    #: (0: on-policy, the synchronous run's samples); ``async`` generation waits rather than break the bound,
    #: ``stream`` drops the group and generates its prompt again (``stream/dropped_stale``). ``null``: 1 in
    #: ``async``; 4 in ``stream``, where a long group lives through a few steps (at one batch of
    #: over-sampling a group stays two steps on average).
    max_staleness: int | None = attrs.field(default=None, validator=attrs.validators.optional(_non_negative))
    #: ``async``: generate in chunks of ``rollout_chunk_tokens`` and let a weight update land between
    #: chunks: responses in flight continue under the new weights (each token records its version).
    partial_rollout: bool = False
    #: ``async`` with ``partial_rollout``, and ``stream``: tokens per response per generate call (a
    #: ``stream`` step's cut falls between two such rounds).
    rollout_chunk_tokens: int = attrs.field(default=256, validator=_positive)
    #: ``trainer.mode: stream``: how many groups are in flight and which finished ones a step trains on.
    stream: StreamConfig = attrs.Factory(lambda: StreamConfig())
    #: ``one_step_off`` and ``async``: ``free`` lets the rollout thread run as far ahead as the staleness
    #: bound allows (what is trained when then depends on timing); ``lockstep`` makes step ``k`` generate
    #: under version ``k - 1 - max_staleness`` exactly, the trainer's sync waiting for that generation to end,
    #: so the same command trains the same samples twice (the suite's asynchronous tests use it).
    schedule: str = attrs.field(default="free", validator=_one_of("free", "lockstep"))
    #: Overlapping modes: seconds the trainer waits for a generated batch before it stops the run with an
    #: error naming the rollout (a live rollout that is only slow: raise it).
    rollout_wait_timeout_s: float = 1800.0
    #: ``trainer.backend: ray``: seconds any one call to a worker may run (a generate, a train step, each
    #: phase of a weight sync: joining the transport's group, sending, receiving and loading; building
    #: the engine) before the run stops with an error naming the role, the engine and its plugin, the
    #: phase and the ranks still in it, with the tail of the first one's log. An engine that is only slow:
    #: raise it. ``null``: no limit (a hung collective then waits forever). The ``local`` backend runs
    #: every call in the driver's own thread, which cannot be interrupted: it has no such limit.
    call_timeout_s: float | None = attrs.field(default=1800.0, validator=_positive)
    #: Colocated or hybrid placement: also move the train roles' weights and optimizer state off the devices while
    #: the rollout generates (room for a larger KV cache, at the cost of a copy each way every step).
    release_train_in_rollout: bool = False
    #: Before a train role splits a batch over its data-parallel ranks (each mini-batch of an update,
    #: each ``infer``), reorder its rows so every rank gets about the same number of tokens
    #: (``attention_mask`` sums; Karmarkar-Karp over equal row counts), so they wait less for each other
    #: at every all-reduce. Mini-batches, losses and gradients stay the same (to float rounding); metrics
    #: averaged over micro-batches (``actor/pg_clipfrac`` ...) can shift, as micro-batches hold other rows.
    balance_batch: bool = True
    #: Ray cluster to join (``auto``, ``host:port``, ``ray://...``); ``None`` starts a local one
    #: (``RAY_ADDRESS`` is used when set).
    ray_address: str | None = None
    #: ``ray`` (workers are Ray actors), ``local`` (every role in the driver's process) or ``auto``:
    #: ``local`` when the run is one process's work on a CPU (``trainer.placement`` hybrid, one rank a train
    #: role, one rollout replica, no Ray cluster to join), where Ray's processes and round trips made a small
    #: step 1.2x slower and start-up 20 s longer; else ``ray``. Worker restarts (``max_restarts``) need ``ray``.
    backend: str = attrs.field(default="auto", validator=_one_of("auto", "ray", "local"))
    #: Where runs are written; each run gets ``<output_dir>/<experiment_name>``.
    output_dir: str = "runs"
    #: Name of this run's directory; ``None``: the algorithm name and a timestamp.
    experiment_name: str | None = None
    #: Save a checkpoint every N steps (0: only at the end; -1: never, verl's setting, for benchmarks whose
    #: checkpoint would only cost time and disk).
    save_freq: int = attrs.field(default=0, validator=_at_least_minus_one)
    #: ``auto`` resumes from the latest checkpoint in the run directory, ``disable`` starts fresh, or a path.
    resume: str = "auto"
    #: When a worker process dies (a killed train rank or rollout replica, the OOM killer, a lost node), stop
    #: every worker and start them again from this run's last checkpoint (from the start when it has none),
    #: at most this many times a run; each restart is a line in the driver's log and ``faults/restarts`` in
    #: the metrics. 1: one restart rides out a transient loss, while a failure that comes back (a model
    #: that does not fit, a bad node) stops the run with its report instead of repeating it. A worker
    #: method that raises (a bug, bad input) never restarts. 0: stop at the first death.
    max_restarts: int = attrs.field(default=1, validator=_non_negative)
    #: Validate every N steps (0: only before and after training).
    val_freq: int = 10
    #: Validate before the first step.
    val_before_train: bool = True
    #: Metric sinks: ``console``, ``jsonl``, ``tensorboard``, ``wandb``, ``mlflow``.
    loggers: list[str] = attrs.Factory(lambda: ["console", "jsonl", "tensorboard"])
    #: What reaches the terminal besides the run's own progress, step lines and errors. ``quiet``: nothing;
    #: engine and library output (vLLM, Ray, HF, torch warnings) goes to ``<run dir>/logs/`` (``driver.log``,
    #: ``<role>-<rank>.log``). ``warning``, ``info``, ``debug``: that output streams to the terminal as
    #: before, Python loggers at that level (``rlcore train --verbose`` is ``info``).
    log_level: str = attrs.field(default="quiet", validator=_one_of("quiet", "warning", "info", "debug"))
    #: Profile this step (0: none) with ``torch.profiler`` in every worker (actor, reference, critic,
    #: rollout): each writes the operators that took the most device time (CPU time on CPUs) to
    #: ``<run dir>/profile/step<N>/<role>-<rank>.txt``. The profiled step runs slower; time another.
    profile_step: int = attrs.field(default=0, validator=attrs.validators.ge(0))


@attrs.define(kw_only=True)
class RLConfig:
    """A whole run. Top-level keys besides these are plugin sections named after their engine.

    A run given no ``data.train_files`` trains on the built-in task ``copy_word`` (tiny model, GRPO,
    a short supervised warm-up), whose settings lie under the user's: ``rlcore config`` shows them.
    """

    #: Train engine plugin for actor, critic and reference (``fsdp``, ``megatron`` ...).
    engine: str = "fsdp"
    trainer: TrainerConfig = attrs.Factory(TrainerConfig)
    model: ModelConfig = attrs.Factory(ModelConfig)
    data: DataConfig = attrs.Factory(DataConfig)
    algorithm: AlgorithmConfig = attrs.Factory(AlgorithmConfig)
    actor: ActorConfig = attrs.Factory(ActorConfig)
    critic: CriticConfig = attrs.Factory(CriticConfig)
    rollout: RolloutConfig = attrs.Factory(RolloutConfig)
    reward: RewardConfig = attrs.Factory(RewardConfig)
    reward_model: RewardModelConfig = attrs.Factory(RewardModelConfig)
    teacher: TeacherConfig = attrs.Factory(TeacherConfig)
    agent: AgentConfig = attrs.Factory(AgentConfig)
    sandbox: SandboxConfig = attrs.Factory(SandboxConfig)
    sft: SFTConfig = attrs.Factory(SFTConfig)
    transport: TransportConfig = attrs.Factory(TransportConfig)
    #: Which roles run in a Python environment of their own (``roles: {rollout: sglang}``).
    environments: EnvironmentsConfig = attrs.Factory(EnvironmentsConfig)
    #: Plugin sections, by name (``fsdp``, ``vllm`` ...), each an instance of the plugin's config class.
    plugins: dict[str, Any] = attrs.Factory(dict)

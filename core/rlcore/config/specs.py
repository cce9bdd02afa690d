"""What a resolved run config builds for the engines: each train role's :class:`~rlcore.api.EngineSpec`
and the rollout's :class:`~rlcore.api.RolloutSpec`, the plugin config section and world size of each
role, and the dtype the weight stream is sent in.

Below the loop and the algorithm flows, which both read these (the flows' weight sync needs the
rollout's dtype).
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from rlcore.api import EngineSpec, LoraSpec, RolloutSpec
from rlcore.api.train_engine import AUTO_MICRO_BATCH

#: ``EngineSpec.micro_batch_size`` while an ``"auto"`` budget is pending: the worker replaces it with the
#: rows its budget holds (rlcore.cluster.micro_batching.resolve).
DEFAULT_MICRO_BATCH_SIZE = 8


def optimizer_steps(config: Any) -> int:
    """Optimizer steps of the whole run (the LR schedule's length): per training step, ``ppo_epochs``
    passes of ``train_batch_size / ppo_mini_batch_size`` mini-batches; plus the SFT warm-up's steps."""
    mini = config.actor.ppo_mini_batch_size
    per_epoch = 1 if mini is None else math.ceil(config.data.train_batch_size / mini)
    return config.trainer.total_steps * config.actor.ppo_epochs * per_epoch + config.trainer.warmup_sft_steps


def engine_spec(config: Any, role: str) -> EngineSpec:
    """The :class:`~rlcore.api.EngineSpec` of train role ``role`` (``actor``, ``critic``, ``reference``,
    ``reward_model``, ``teacher``)."""
    if role == "reward_model":
        from rlcore.rewards.model_config import reward_model_spec

        return reward_model_spec(config)
    if role == "teacher":
        from rlcore.distill.config import teacher_spec

        return teacher_spec(config)
    temperature = config.rollout.temperature if config.rollout.temperature > 0 else 1.0
    section = config.critic if role == "critic" else config.actor
    optim = section.optim
    return EngineSpec(
        model_path=(config.critic.model_path or config.model.path) if role == "critic" else config.model.path,
        head="value" if role == "critic" else "lm",
        trainable=role != "reference",
        dtype=config.model.dtype,
        lr=optim.lr,
        weight_decay=optim.weight_decay,
        betas=tuple(optim.betas),
        grad_clip=optim.grad_clip,
        warmup_steps=optim.warmup_steps,
        total_steps=optimizer_steps(config),
        lr_schedule=optim.lr_schedule,
        min_lr_ratio=optim.min_lr_ratio,
        micro_batch_size=section.micro_batch_size or DEFAULT_MICRO_BATCH_SIZE,
        max_tokens_per_micro_batch=micro_batch_tokens(section, role),
        max_sequence_length=config.data.max_prompt_length + config.rollout.max_response_length,
        gradient_checkpointing=config.actor.gradient_checkpointing if role != "critic" else False,
        temperature=temperature,
        seed=config.trainer.seed,
        lora=lora_spec(config) if role == "actor" else None,
        freeze_vision_tower=config.actor.freeze_vision_tower and role == "actor",
    )


def lora_spec(config: Any) -> LoraSpec | None:
    """The actor's :class:`~rlcore.api.LoraSpec` from ``actor.lora``, or None when ``rank`` is 0."""
    lora = config.actor.lora
    if lora.rank == 0:
        return None
    targets = lora.target_modules
    return LoraSpec(
        rank=lora.rank,
        alpha=float(lora.alpha),
        target_modules=targets if isinstance(targets, str) else tuple(targets),
        dropout=float(lora.dropout),
    )


def micro_batch_tokens(section: Any, role: str) -> int | str | None:
    """``EngineSpec.max_tokens_per_micro_batch`` of ``role`` from its config ``section``: the actor's (and
    reference's) explicit budget, else ``"auto"`` (the worker sizes one from its device,
    :mod:`rlcore.cluster.micro_batching`) unless ``micro_batch_size`` fixes the rows."""
    budget = None if role == "critic" else section.max_tokens_per_micro_batch
    if budget is not None:
        return budget
    return AUTO_MICRO_BATCH if section.micro_batch_size is None else None


def rollout_dtype_name(config: Any) -> str:
    """The rollout engine's parameter dtype: ``rollout.dtype``, else (null, or ``auto`` in a config that
    :func:`rlcore.config.auto.resolve_auto` has not seen) ``model.dtype``."""
    dtype = config.rollout.dtype
    return config.model.dtype if dtype in (None, "auto") else dtype


def rollout_spec(config: Any) -> RolloutSpec:
    return RolloutSpec(
        model_path=config.model.path,
        dtype=rollout_dtype_name(config),
        tensor_parallel_size=config.rollout.tensor_parallel_size,
        max_model_len=config.data.max_prompt_length + config.rollout.max_response_length,
        gpu_memory_utilization=config.rollout.gpu_memory_utilization,
        seed=config.trainer.seed,
        lora=lora_spec(config) if config.actor.lora.sync != "merged" else None,
        lora_sync=config.actor.lora.sync if config.actor.lora.sync != "merged" else "auto",
        quantization=config.rollout.quantization,
    )


def engine_section(config: Any, kind: str, name: str) -> Any:
    """Engine ``name``'s config section (``kind``: ``train_engines`` or ``rollout_engines``).

    A train and a rollout engine of the same name (the fakes) share one YAML section; each gets the
    fields its own config class has.
    """
    from rlcore.plugins import registry

    section = config.plugins.get(name)
    cls = registry(kind).entry(name).options.get("config")
    if section is None or cls is None or isinstance(section, cls):
        return section
    shared = {f.name: getattr(section, f.name) for f in attrs.fields(cls) if hasattr(section, f.name)}
    return cls(**shared)


def role_engine(config: Any, role: str) -> str:
    """The train engine plugin of ``role``: ``reward_model.engine`` for the reward model and
    ``teacher.engine`` for the teacher (when set), else the run's ``engine``."""
    if role == "reward_model":
        from rlcore.rewards.model_config import reward_model_engine

        return reward_model_engine(config)
    if role == "teacher":
        from rlcore.distill.config import teacher_engine

        return teacher_engine(config)
    return config.engine


def role_world_size(config: Any, role: str) -> int:
    sizes = {
        "critic": config.critic.world_size,
        "reward_model": config.reward_model.world_size,
        "teacher": config.teacher.world_size,
    }
    return sizes.get(role, config.actor.world_size)


#: The post-sync check's absolute cap on the trimmed mean |trainer - rollout| log-prob per dtype (the less
#: precise of rollout and trainer; ``transport.max_logprob_diff: auto``). Healthy pairs measured: fp32 1e-5
#: on the CPU, 0.0003-0.0035 on GPUs (TF32 matmuls); bf16 0.0003-0.0105 (random-weight 0.5B), 0.05-0.07 at
#: the first sync of SmolLM2 (fp32 trainer, bf16 rollout), up to 0.19 with a LoRA adapter merged into bf16
#: weights. A wrong engine: 0.6-2 (a stale prefix cache, an unsent lm_head, argmax log-probs on random
#: weights); on SmolLM2 docs/benchmarks.md has the argmax and temperature-ignoring gaps.
#: ``float8`` stands for a rollout that quantizes its weights (``rollout.quantization: fp8``): e4m3 keeps 3
#: mantissa bits against bf16's 7, so its gap is of another order; its cap and margin are wide, and the
#: shape tests (argmax, temperature) are what still tell a wrong engine there.
LOGPROB_DIFF_BY_DTYPE = {"float64": 0.02, "float32": 0.02, "float16": 0.1, "bfloat16": 0.3, "float8": 1.5}

#: A later sync may reach ``max(SYNC_FLOOR_FACTOR * floor, floor + margin)`` (capped as above), the floor
#: being the same statistic at the initial sync, when rollout and trainer hold the same weights.
SYNC_FLOOR_FACTOR = 3.0
#: The margin over the floor per dtype: what training moves a healthy pair's gap by (bf16 on SmolLM2:
#: 0.05-0.07 at the first sync, 0.14-0.19 with a merged LoRA adapter: a margin of 0.2).
SYNC_FLOOR_MARGIN = {"float64": 0.005, "float32": 0.005, "float16": 0.05, "bfloat16": 0.2, "float8": 0.5}
#: The range of the gap a bf16 engine against an fp32 one gives (the check's dtype diagnosis).
DTYPE_GAP = (0.02, 0.3)

_PRECISION = ("float64", "float32", "float16", "bfloat16")


def check_dtype(config: Any) -> str:
    """The dtype the post-sync check's numbers are taken from: the less precise of the rollout's and the
    trainer's (``model.dtype``); ``float8`` when the rollout quantizes (``rollout.quantization``)."""
    if config.rollout.quantization == "fp8":
        return "float8"
    pair = [rollout_dtype_name(config), config.model.dtype]
    return max(pair, key=lambda d: _PRECISION.index(d) if d in _PRECISION else -1)


def logprob_diff_threshold(config: Any) -> float | None:
    """``transport.max_logprob_diff`` as a number: ``auto`` becomes the check dtype's cap
    (:data:`LOGPROB_DIFF_BY_DTYPE`, :func:`check_dtype`), ``None`` stays (report only)."""
    value = config.transport.max_logprob_diff
    if value != "auto":
        return value
    dtype = check_dtype(config)
    if dtype not in LOGPROB_DIFF_BY_DTYPE:
        raise ValueError(
            f"transport.max_logprob_diff: auto has no bound for the dtype {dtype!r} (known: "
            f"{', '.join(LOGPROB_DIFF_BY_DTYPE)}); set a number, or null to only report the gap"
        )
    return LOGPROB_DIFF_BY_DTYPE[dtype]


def sync_check_bound(config: Any, floor: float | None) -> float | None:
    """The bound of one post-sync check: ``auto`` with a measured ``floor`` is
    ``min(max(SYNC_FLOOR_FACTOR * floor, floor + margin), cap)``, without one (the sync that measures it)
    the cap; a number is that number at every sync; ``None`` (report only) stays."""
    cap = logprob_diff_threshold(config)
    if config.transport.max_logprob_diff != "auto" or floor is None:
        return cap
    from rlcore.rollout.sync_check import sync_bound

    margin = SYNC_FLOOR_MARGIN[check_dtype(config)]
    return sync_bound(floor, factor=SYNC_FLOOR_FACTOR, margin=margin, cap=cap)


#: ``trainer.max_staleness: null`` by mode.
DEFAULT_STALENESS = {"async": 1, "stream": 4}


def max_staleness(config: Any) -> int:
    """How many policy versions a trained sample may lag: 0 in ``sync`` mode, 1 in ``one_step_off``,
    ``trainer.max_staleness`` in ``async`` and ``stream`` (``null``: :data:`DEFAULT_STALENESS`)."""
    mode, chosen = config.trainer.mode, config.trainer.max_staleness
    if mode in ("sync", "one_step_off"):
        return {"sync": 0, "one_step_off": 1}[mode]
    return DEFAULT_STALENESS[mode] if chosen is None else chosen


def stream_over_sampling(config: Any) -> int:
    """Groups the stream keeps in flight beyond the batch: ``trainer.stream.over_sampling``, ``null``:
    ``data.train_batch_size``."""
    chosen = config.trainer.stream.over_sampling
    return config.data.train_batch_size if chosen is None else chosen


def off_policy_correction(config: Any) -> str:
    """``algorithm.off_policy`` with ``auto`` resolved: ``tis`` when samples can be stale or the rollout
    quantizes its weights, else ``none``."""
    chosen = config.algorithm.off_policy
    if chosen != "auto":
        return chosen
    # A quantized rollout samples from other weights than the trainer's at every step, as stale samples
    # do: verl finds token-level TIS needed to hold bf16 accuracy with FP8 rollout (PEERS.md).
    stale = max_staleness(config) > 0 or config.rollout.quantization is not None
    return "tis" if stale else "none"


def rollout_chunk_tokens(config: Any) -> int | None:
    """Tokens per response per generate call when responses continue across weight updates (``async``
    mode with ``trainer.partial_rollout``), else ``None``: every response in one call."""
    t = config.trainer
    return t.rollout_chunk_tokens if t.mode == "async" and t.partial_rollout else None

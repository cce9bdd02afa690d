"""The ``teacher:`` section: the model on-policy distillation learns from, run forward-only on a worker
group of its own (placed like the reference model), and the :class:`~rlcore.api.EngineSpec` it is
built from.

Light to import (the config schema imports it; no torch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

#: The role's name in placements, worker logs and metrics.
ROLE = "teacher"


def _positive(instance: Any, attribute: attrs.Attribute, value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"teacher.{attribute.name} must be >= 1, got {value!r}")


def _dtype(instance: Any, attribute: attrs.Attribute, value: str | None) -> None:
    if value is not None and value not in ("float32", "bfloat16", "float16"):
        raise ValueError(
            f"teacher.{attribute.name} must be float32, bfloat16, float16 or null; got {value!r}"
        )


@attrs.define(kw_only=True)
class TeacherConfig:
    """The teacher of on-policy distillation (``algorithm.name: opd``): any causal LM (another size or
    architecture than the student's) that shares the student's tokenizer. It computes the log-probs of
    the student's sampled tokens, forward-only, frozen, at the rollout's temperature (as the reference
    model does); it is never trained, synced or checkpointed."""

    #: Hugging Face folder of a causal LM (``...ForCausalLM``), or a built-in model (``builtin:tiny``).
    model_path: str | None = None
    #: Tokenizer folder of the teacher; defaults to ``model_path``. It must have the student's vocabulary
    #: (the same token for every id): the teacher scores the student's token ids as they are.
    tokenizer_path: str | None = None
    #: Train engine plugin that runs the teacher (its ``lm`` head, forward only); ``null``: the run's ``engine``.
    engine: str | None = None
    #: Ranks of the teacher's engine (data parallel for scoring; with the engine's own sharding a teacher
    #: larger than one device's memory).
    world_size: int = attrs.field(default=1, validator=_positive)
    #: Sequences per forward on one rank; ``null``: sized from a token budget (``max_tokens_per_micro_batch``,
    #: or ``auto`` from the device's memory, as the actor's).
    micro_batch_size: int | None = attrs.field(default=None, validator=_positive)
    #: Token budget of one forward on one rank; ``null``: ``auto`` unless ``micro_batch_size`` is set.
    max_tokens_per_micro_batch: int | None = attrs.field(default=None, validator=_positive)
    #: Parameter dtype of the teacher; ``null``: ``model.dtype``.
    dtype: str | None = attrs.field(default=None, validator=_dtype)


def teacher_spec(config: Any) -> Any:
    """The :class:`~rlcore.api.EngineSpec` of the teacher role of run ``config`` (an ``RLConfig``): the
    ``lm`` head, frozen, log-probs at the rollout's temperature (the student's are taken at the same one)."""
    from rlcore.api.train_engine import AUTO_MICRO_BATCH, EngineSpec

    teacher = config.teacher
    budget = teacher.max_tokens_per_micro_batch
    if budget is None and teacher.micro_batch_size is None:
        budget = AUTO_MICRO_BATCH
    return EngineSpec(
        model_path=teacher.model_path,
        head="lm",
        trainable=False,
        dtype=teacher.dtype or config.model.dtype,
        micro_batch_size=teacher.micro_batch_size or 8,
        max_tokens_per_micro_batch=budget,
        max_sequence_length=config.data.max_prompt_length + config.rollout.max_response_length,
        temperature=config.rollout.temperature if config.rollout.temperature > 0 else 1.0,
        seed=config.trainer.seed,
    )


def teacher_engine(config: Any) -> str:
    """The train engine plugin that runs the teacher."""
    return config.teacher.engine or config.engine


def with_resolved_paths(teacher: TeacherConfig, resolve: Any) -> TeacherConfig:
    """``teacher`` with ``model_path`` and ``tokenizer_path`` passed through ``resolve`` (the run's model
    path resolver: built-in models built, local folders made absolute, as workers may run elsewhere)."""
    paths = {}
    for key in ("model_path", "tokenizer_path"):
        value = getattr(teacher, key)
        if value:
            paths[key] = resolve(value)
    return attrs.evolve(teacher, **paths)


def tokenizer_folder(teacher: TeacherConfig) -> Path:
    return Path(teacher.tokenizer_path or teacher.model_path).expanduser()

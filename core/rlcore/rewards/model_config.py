"""The ``reward_model:`` section: a sequence-classification reward model scoring responses on a worker
group of its own, and the start-up checks of the model folder it names.

Light to import (the config schema imports it; no torch). The checks read files only (``config.json``,
the tokenizer), so ``rlcore train`` runs them before any engine starts (:mod:`rlcore.trainer.preflight`) and the trainer runs them again for runs started
from Python.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

COMBINE_MODES = ("replace", "add")
#: The ``EngineSpec.head`` of the reward-model role: one scalar per sequence, read at its last token.
SCORE_HEAD = "score"
ROLE = "reward_model"


def _positive(instance: Any, attribute: attrs.Attribute, value: int) -> None:
    if value < 1:
        raise ValueError(f"reward_model.{attribute.name} must be >= 1, got {value!r}")


def _combine(instance: Any, attribute: attrs.Attribute, value: str) -> None:
    if value not in COMBINE_MODES:
        raise ValueError(f"reward_model.combine must be one of {', '.join(COMBINE_MODES)}; got {value!r}")


def _dtype(instance: Any, attribute: attrs.Attribute, value: str | None) -> None:
    if value is not None and value not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"reward_model.dtype must be float32, bfloat16, float16 or null; got {value!r}")


@attrs.define(kw_only=True)
class RewardModelConfig:
    """A reward model: a Hugging Face ``...ForSequenceClassification`` with one label, run forward-only by
    a train engine's ``score`` head on a worker group of its own (placed like the reference model). Its
    score of each prompt + response sits on the response's last token."""

    #: Score responses with the reward model (its role joins the run's placement).
    enabled: bool = False
    #: Local Hugging Face folder of a sequence-classification model with ``num_labels: 1``.
    model_path: str | None = None
    #: Tokenizer folder of the reward model; defaults to ``model_path``. When it has the policy's vocabulary
    #: and chat template, the policy's token ids are scored as they are; otherwise prompt and response are
    #: decoded and re-tokenized with this tokenizer and its chat template.
    tokenizer_path: str | None = None
    #: Train engine plugin that runs the model (its ``score`` head, forward only); ``null``: the run's ``engine``.
    engine: str | None = None
    #: Ranks of the reward model's engine (data parallel for scoring).
    world_size: int = attrs.field(default=1, validator=_positive)
    #: Sequences per forward on one rank.
    micro_batch_size: int = attrs.field(default=8, validator=_positive)
    #: Parameter dtype of the reward model; ``null``: ``model.dtype``.
    dtype: str | None = attrs.field(default=None, validator=_dtype)
    #: ``replace``: the reward is the model's score alone (verl's behaviour when a reward model is on);
    #: ``add``: the model's score plus the ``reward.provider``'s (rule) score of the same response.
    combine: str = attrs.field(default="replace", validator=_combine)


def reward_model_spec(config: Any) -> Any:
    """The :class:`~rlcore.api.EngineSpec` of the reward-model role of run ``config`` (an ``RLConfig``):
    the ``score`` head, frozen, in eval-mode inference only."""
    from rlcore.api.train_engine import EngineSpec

    rm = config.reward_model
    return EngineSpec(
        model_path=rm.model_path,
        head=SCORE_HEAD,
        trainable=False,
        dtype=rm.dtype or config.model.dtype,
        micro_batch_size=rm.micro_batch_size,
        seed=config.trainer.seed,
    )


def reward_model_engine(config: Any) -> str:
    """The train engine plugin that runs the reward model."""
    return config.reward_model.engine or config.engine


def absolute_paths(rm: RewardModelConfig) -> RewardModelConfig:
    """``rm`` with its existing local folders made absolute (workers may run in another directory)."""
    paths = {}
    for key in ("model_path", "tokenizer_path"):
        value = getattr(rm, key)
        if value and Path(value).expanduser().exists():
            paths[key] = str(Path(value).expanduser().resolve())
    return attrs.evolve(rm, **paths)


# -- start-up checks -------------------------------------------------------------------------------
def reward_model_problems(config: Any) -> list[str]:
    """What is wrong with the ``reward_model:`` section of ``config``, one ``'key': message`` line each
    (empty when the reward model is off or fine). Reads ``config.json`` and loads the tokenizer."""
    rm = config.reward_model
    if not rm.enabled:
        return []
    if not rm.model_path:
        return [
            "'reward_model.model_path': required when reward_model.enabled=true; set it to a local Hugging Face "
            "folder of a sequence-classification model with num_labels=1 (or set reward_model.enabled=false)"
        ]
    problems = []
    folder = Path(rm.model_path).expanduser()
    problem = _model_folder_problem(folder)
    if problem:
        problems.append(f"'reward_model.model_path': {problem}")
    engine_problem = _engine_problem(config)
    if engine_problem:
        problems.append(engine_problem)
    if not problems:
        tokenizer_problem = _tokenizer_problem(config)
        if tokenizer_problem:
            problems.append(tokenizer_problem)
    return problems


def _model_folder_problem(folder: Path) -> str | None:
    from rlcore.models.folders import architecture_problem, read_hf_config

    hf_config, problem = read_hf_config(
        folder,
        "a local Hugging Face folder of a sequence-classification reward model (engines do not download)",
    )
    if problem:
        return problem
    problem = architecture_problem(
        folder,
        hf_config,
        "ForSequenceClassification",
        "reward model: its score head would start from random weights. Export or train a "
        "sequence-classification model (AutoModelForSequenceClassification, num_labels=1)",
    )
    if problem:
        return problem
    labels = num_labels(hf_config)
    if labels != 1:
        return (
            f"{str(folder)!r} has num_labels={labels}; a reward model gives one scalar per sequence. Use a "
            "model trained with num_labels=1 (a classifier's logits are not a reward)"
        )
    return None


def num_labels(hf_config: dict[str, Any]) -> int:
    """Labels of a saved HF config: ``id2label``'s size (what ``save_pretrained`` writes), else
    ``num_labels``, else transformers' default of 2."""
    if hf_config.get("id2label"):
        return len(hf_config["id2label"])
    return int(hf_config.get("num_labels", 2))


def _engine_problem(config: Any) -> str | None:
    """The engine must implement the ``score`` head (engines declare theirs in ``TrainEngine.heads``)."""
    from rlcore.plugins import registry
    from rlcore.plugins.registries import RegistryError

    name = reward_model_engine(config)
    key = "reward_model.engine" if config.reward_model.engine else "engine"
    try:
        entry = registry("train_engines").entry(name)
        engine_cls = entry.load()
    except RegistryError as exc:
        return f"'{key}': {exc}"
    heads = getattr(engine_cls, "heads", None)
    if heads is not None and SCORE_HEAD not in heads:
        return (
            f"'{key}': train engine {name!r} (plugin {entry.plugin}) has no {SCORE_HEAD!r} head (it declares "
            f"{', '.join(heads)}), which the reward model runs on; set reward_model.engine to an engine that has "
            f"one ({', '.join(score_engines()) or 'none installed'})"
        )
    return None


def score_engines() -> list[str]:
    """Installed train engines that declare the ``score`` head."""
    from rlcore.plugins import registry

    names = registry("train_engines")
    found = []
    for name in names.names():
        try:
            heads = getattr(names.get(name), "heads", None)
        except Exception:  # a broken plugin is reported where it is selected, not here
            continue
        if heads is not None and SCORE_HEAD in heads:
            found.append(name)
    return found


def _tokenizer_problem(config: Any) -> str | None:
    rm = config.reward_model
    key = "reward_model.tokenizer_path" if rm.tokenizer_path else "reward_model.model_path"
    try:
        tokenizer = load_rm_tokenizer(rm)
    except Exception as exc:
        return f"'{key}': no tokenizer could be loaded from it ({type(exc).__name__}: {exc})"
    if getattr(tokenizer, "pad_token_id", None) is None and getattr(tokenizer, "eos_token_id", None) is None:
        return f"'{key}': the reward model's tokenizer has neither a pad nor an EOS token to pad batches with"
    return None


def load_rm_tokenizer(rm: RewardModelConfig) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(Path(rm.tokenizer_path or rm.model_path).expanduser()))

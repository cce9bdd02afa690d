"""What ``rlcore train`` checks before it creates the run directory.

:func:`rlcore.config.load_config` has already checked keys, types, values and the registered names.
What is left needs more than the config: importing the selected components (a plugin whose module
fails to import), the algorithm's preset merged with the user's ``algorithm:`` fields, and the files
the run reads. Each check is cheap next to starting engines, and a failure here leaves no half-made
``runs/<name>/`` behind; what fails later (a malformed data row, an engine that cannot start) is
reported from the run directory, with ``error.log``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from rlcore.config.loader import invalid_config, resolve_rollout
from rlcore.plugins.registries import RegistryError


def check_run(config: Any) -> None:
    """Raise :class:`~rlcore.config.ConfigError` naming every problem found in ``config`` (an
    :class:`~rlcore.config.schema.RLConfig` from ``load_config``), one line per key path."""
    problems = [
        *_component_problems(config),
        *_algorithm_problems(config),
        *_logger_problems(config),
        *_model_problems(config),
        *_file_problems(config),
        *_reward_model_problems(config),
        *_teacher_problems(config),
        *_placement_problems(config),
        *_transport_problems(config),
        *config.sandbox.missing_layers(),  # sandbox.require: layers that must hold here
    ]
    if problems:
        raise invalid_config(problems)


# -- components --------------------------------------------------------------------------------
def _import_problem(key: str, registry_key: str, name: str) -> str | None:
    """A component registered lazily (``"module:attr"``) is imported here, so a plugin whose module is
    broken fails now rather than in every worker."""
    from rlcore.plugins import registry

    try:
        registry(registry_key).get(name)
    except RegistryError as exc:
        return f"'{key}': {exc}"
    return None


def _component_problems(config: Any) -> Iterator[str]:
    chosen = [
        ("engine", "train_engines", config.engine),
        ("rollout.engine", "rollout_engines", resolve_rollout(config.rollout.engine)),
        ("reward.provider", "reward_providers", config.reward.provider),
        ("transport.name", "weight_transports", config.transport.name),
        ("trainer.device", "device_platforms", config.trainer.device),
    ]
    # A role in an environment of its own imports its engine there, where its libraries are (rlcore.envs):
    # in the driver's environment they may be missing or another version.
    apart = {"engine": "actor", "rollout.engine": "rollout"}
    for key, registry_key, name in chosen:
        if key in apart and apart[key] in config.environments.roles:
            continue
        if name != "auto":  # chosen among the installed ones when the roles are built
            problem = _import_problem(key, registry_key, name)
            if problem:
                yield problem
    yield from _lora_problems(config)
    if "rollout" not in config.environments.roles:
        yield from _quantization_problems(config)


def _lora_problems(config: Any) -> Iterator[str]:
    """``actor.lora`` needs a train engine that trains adapters, and ``sync: adapter`` a rollout that
    loads them (the rollout can only be asked once built: its worker refuses then)."""
    from rlcore.plugins import registry

    if config.actor.lora.rank == 0:
        return
    try:
        engine = registry("train_engines").get(config.engine)
    except RegistryError:
        return  # reported above
    if not getattr(engine, "supports_lora", False):
        label = registry("train_engines").entry(config.engine).label
        yield (
            f"'actor.lora.rank': {config.actor.lora.rank}, but train engine {label} does not train LoRA "
            "adapters; use --engine fsdp, or actor.lora.rank=0 to train the full model"
        )


def _quantization_problems(config: Any) -> Iterator[str]:
    """``rollout.quantization`` needs a rollout engine that lists it (its worker refuses too, for an
    ``auto`` engine chosen later or one in an environment of its own)."""
    from rlcore.api import check_quantization
    from rlcore.plugins import registry

    name = resolve_rollout(config.rollout.engine)
    if config.rollout.quantization is None or name == "auto":
        return
    try:
        engine = registry("rollout_engines").get(name)
    except RegistryError:
        return  # reported above
    try:
        check_quantization(config.rollout.quantization, engine, registry("rollout_engines").entry(name).label)
    except ValueError as exc:
        yield f"'rollout.quantization': {exc}"


def _algorithm_problems(config: Any) -> Iterator[str]:
    """The algorithm, and the preset the run will use: the user's fields over the algorithm's defaults
    (an estimator that needs a critic under a preset without one fails here, not after engines start)."""
    from rlcore.algorithms.aggregation import check_loss_agg_mode
    from rlcore.algorithms.kl import check_kl_kind
    from rlcore.flows import resolve_preset
    from rlcore.plugins import registry

    problem = _import_problem("algorithm.name", "algorithms", config.algorithm.name)
    if problem:
        yield problem
        return
    try:
        preset = resolve_preset(config.algorithm, registry("algorithms").get(config.algorithm.name))
    except ValueError as exc:
        yield f"'algorithm': {_unprefixed(exc, 'algorithm')}"
        return
    # The preset's names may come from a third-party algorithm's defaults, unchecked so far.
    for key, registry_key, name in (
        ("algorithm.adv_estimator", "advantage_estimators", preset.adv_estimator),
        ("algorithm.policy_loss", "policy_losses", preset.policy_loss),
    ):
        problem = _import_problem(key, registry_key, name)
        if problem:
            yield problem
    checks = [("algorithm.loss_agg_mode", check_loss_agg_mode, preset.loss_agg_mode)]
    if preset.use_kl_loss:
        checks.append(("algorithm.kl_loss_type", check_kl_kind, preset.kl_loss_type))
    if preset.use_kl_in_reward:
        checks.append(("algorithm.kl_penalty", check_kl_kind, preset.kl_penalty))
    for key, check, value in checks:
        try:
            check(value)
        except ValueError as exc:
            yield f"'{key}': {exc}"


def _logger_problems(config: Any) -> Iterator[str]:
    from rlcore.telemetry.loggers import check_logger_names

    try:
        check_logger_names(config.trainer.loggers)
    except ValueError as exc:
        yield f"'trainer.loggers': {_unprefixed(exc, 'trainer.loggers')}"


def _unprefixed(exc: Exception, key: str) -> str:
    """``exc``'s message without its own ``key: `` prefix: the problem list quotes key paths itself."""
    return str(exc).removeprefix(f"{key}: ")


# -- files -------------------------------------------------------------------------------------
def _model_problems(config: Any) -> Iterator[str]:
    """Model folders that do not exist, and built-in models that cannot be built here (they are built
    later, when the run starts)."""
    from rlcore.models import builtin_name, missing_requirement
    from rlcore.trainer.run import resolve_model_path

    for key, path in (
        ("model.path", config.model.path),
        ("model.tokenizer_path", config.model.tokenizer_path),
        ("critic.model_path", config.critic.model_path),
    ):
        if path is None:
            continue
        try:
            name = builtin_name(path)
            if name is not None:  # built when the run starts; here only whether it can be
                problem = missing_requirement(name)
                if problem:
                    yield f"'{key}': {problem}"
                continue
            resolve_model_path(path)
        except (ValueError, FileNotFoundError) as exc:
            yield f"'{key}': {exc}"


def _reward_model_problems(config: Any) -> list[str]:
    """The reward model's folder (a sequence classifier with one label), tokenizer and engine."""
    from rlcore.rewards.model_config import reward_model_problems

    return reward_model_problems(config)


def _teacher_problems(config: Any) -> Iterator[str]:
    """A distilling algorithm's teacher folder (a causal LM) and engine; a teacher set for an algorithm
    without one. (The tokenizer comparison needs the student's tokenizer: the trainer runs it.)"""
    from rlcore.distill.checks import teacher_problems, unused_teacher_problem
    from rlcore.plugins import registry

    try:
        roles = tuple(getattr(registry("algorithms").get(config.algorithm.name), "roles", ()))
    except RegistryError:
        return  # reported by the algorithm's own check
    unused = unused_teacher_problem(config, roles)
    if unused:
        yield unused
    if "teacher" in roles:
        yield from teacher_problems(config)


def _placement_problems(config: Any) -> Iterator[str]:
    """``trainer.placement=hybrid`` builds each rollout replica inside one actor rank's process and loads
    its weights there: what that rules out, by the key to change (:mod:`rlcore.cluster.placement`)."""
    if config.trainer.placement != "hybrid":
        return
    why = "with trainer.placement=hybrid each rollout replica lives in one actor rank's process"
    if config.rollout.tensor_parallel_size != 1:
        yield (
            f"'rollout.tensor_parallel_size': {why}, so it must be 1 (got {config.rollout.tensor_parallel_size}); "
            "use trainer.placement=colocated for tensor-parallel rollout engines"
        )
    if config.rollout.num_engines > config.actor.world_size:
        yield (
            f"'rollout.num_engines': {why}, so at most actor.world_size ({config.actor.world_size}) replicas "
            f"fit (got {config.rollout.num_engines})"
        )
    if config.transport.name not in ("auto", "inprocess"):
        yield (
            f"'transport.name': {why} and loads the weights there without a transport; set it to auto, or "
            f"use trainer.placement=colocated to send weights with {config.transport.name!r}"
        )


def _transport_problems(config: Any) -> Iterator[str]:
    """A weight transport may work only with some placements or rollout engines; it says which in its
    class attributes ``placements`` and ``rollout_engines`` (``sglang-distributed``: split, sglang)."""
    from rlcore.plugins import registry

    name = config.transport.name
    if name == "auto" or _import_problem("transport.name", "weight_transports", name):
        return
    transport = registry("weight_transports").get(name)
    placements = getattr(transport, "placements", None)
    if placements and config.trainer.placement not in placements:
        yield (
            f"'transport.name': weight transport {name!r} works with trainer.placement "
            f"{' or '.join(placements)}, not {config.trainer.placement!r}"
        )
    engines = getattr(transport, "rollout_engines", None)
    rollout = resolve_rollout(config.rollout.engine)
    if engines and rollout not in engines:
        yield (
            f"'transport.name': weight transport {name!r} loads rollout engine {' or '.join(engines)}, not "
            f"{rollout!r}; set rollout.engine or choose another transport"
        )


def _file_problems(config: Any) -> Iterator[str]:
    """Data files that do not exist. Only their existence: reading them is the run's first step."""
    lists = [("data.train_files", config.data.train_files), ("data.val_files", config.data.val_files)]
    if config.trainer.warmup_sft_steps > 0:  # otherwise the SFT files are never read
        lists.append(("sft.files", config.sft.files))
    for key, paths in lists:
        for i, path in enumerate(paths):
            problem = _data_file_problem(path)
            if problem:
                yield f"'{key}[{i}]': {problem}"
    path = config.reward.custom_function_path
    if path and not os.path.isfile(path):
        yield f"'reward.custom_function_path': {_missing(path)}"


def _data_file_problem(path: str) -> str | None:
    from rlcore.tasks import is_builtin, parse_builtin

    if is_builtin(path):
        try:
            parse_builtin(path)  # a known task and split: its file is written into the run
        except ValueError as exc:
            return str(exc)
        return None
    return None if os.path.isfile(path) else _missing(path)


def _missing(path: str) -> str:
    where = "is a directory, not a file" if os.path.isdir(path) else "does not exist"
    return f"{path!r} {where} (working directory {os.getcwd()!r})"

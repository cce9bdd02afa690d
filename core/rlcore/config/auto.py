"""What the config's ``auto`` values for the rollout engine, the placement and the backend become, and why.

``rollout.engine: auto`` asks the device platform the run's workers will use
(:meth:`~rlcore.api.DevicePlatform.default_rollout`: vLLM where installed on accelerators, the HF rollout on
CPUs, where it measured faster); ``trainer.placement: auto`` builds an HF rollout inside the actor's
processes (``hybrid``, no weight transport) whenever the layout allows it, and colocates otherwise;
``trainer.backend: auto`` runs a CPU run whose every role is one process's work in the driver's process
(``local``), and starts workers on Ray otherwise. Each choice comes with a line for the run's log; a value
the user names is kept as named.
"""

from __future__ import annotations

import os
from typing import Any

import attrs

from rlcore.plugins import registry


def choose_rollout(name: str, device: str = "auto", ray_address: str | None = None) -> tuple[str, str]:
    """``(engine, why)`` for ``rollout.engine: name``. The platform is the one ``trainer.device`` picks on
    this machine; when the run joins a Ray cluster (``ray_address`` or ``RAY_ADDRESS``) the workers'
    devices are unknown here, so vLLM when installed, else the HF rollout."""
    if name != "auto":
        return name, f"rollout.engine {name} (as set)"
    installed = tuple(registry("rollout_engines").names())
    if _joins_cluster(ray_address):
        engine = "vllm" if "vllm" in installed else "hf"
        return engine, (
            f"rollout.engine auto -> {engine}: the run joins a Ray cluster whose devices this machine cannot "
            "see (vLLM when installed); set rollout.engine to choose"
        )
    platform = _platform(device)
    engine, why = platform.default_rollout(installed)
    return engine, f"rollout.engine auto -> {engine} on {platform.name}: {why}"


def _joins_cluster(ray_address: str | None) -> bool:
    """Whether the run joins a Ray cluster (``trainer.ray_address`` or ``RAY_ADDRESS``), whose workers'
    devices this machine cannot see."""
    return bool(ray_address or os.environ.get("RAY_ADDRESS"))


def _platform(device: str) -> Any:
    """The device platform ``trainer.device`` picks on this machine (``auto``'s when the name is unknown
    or absent: the name checks report that)."""
    from rlcore.devices import get_platform

    try:
        return get_platform(device)
    except Exception:  # noqa: BLE001 - an unknown or absent platform is reported by the name checks
        return get_platform("auto")


def choose_placement(config: Any, rollout: str) -> tuple[str, str]:
    """``(placement, why)`` for ``trainer.placement`` with rollout engine ``rollout`` resolved. ``auto``:
    ``hybrid`` for the HF rollout when each replica can live in an actor rank's process (one device a
    replica, no more replicas than actor ranks, the synchronous or stream mode, no named transport), else
    ``colocated``."""
    placement = config.trainer.placement
    if placement != "auto":
        return placement, f"trainer.placement {placement} (as set)"
    blockers = []
    if rollout != "hf":
        blockers.append(f"rollout engine {rollout} runs in processes of its own")
    if config.rollout.tensor_parallel_size != 1:
        blockers.append("rollout.tensor_parallel_size is not 1")
    if config.rollout.num_engines > config.actor.world_size:
        blockers.append("rollout.num_engines exceeds actor.world_size")
    if config.trainer.mode not in ("sync", "stream"):  # the stream runs its rounds in turn with the updates
        blockers.append(f"trainer.mode is {config.trainer.mode}")
    if config.transport.name not in ("auto", "inprocess"):
        blockers.append(f"transport.name is {config.transport.name}")
    roles_env = config.environments.roles
    if roles_env.get("rollout") != roles_env.get("actor"):
        blockers.append("the rollout runs in another environment than the actor (environments.roles)")
    if blockers:
        return "colocated", f"trainer.placement auto -> colocated ({'; '.join(blockers)})"
    return "hybrid", (
        "trainer.placement auto -> hybrid: each HF rollout replica is built inside an actor rank's process "
        "and loads the weights there, without a transport or a trip through the driver"
    )


def choose_backend(config: Any, placement: str) -> tuple[str, str]:
    """``(backend, why)`` for ``trainer.backend`` with ``trainer.placement`` resolved to ``placement``.
    ``auto``: ``local`` when the whole run is one process's work on a CPU: the HF rollout inside the actor
    (``hybrid``), one rank for every train role, one rollout replica, no Ray cluster to join. There Ray's
    own processes and per-call round trips made the small CPU step 1.2x slower and the run's start-up about
    20 s longer on two cores (docs/benchmarks.md, ``grpo-step-vs-trl-cpu-small-defaults``). Else ``ray``."""
    backend = config.trainer.backend
    if backend != "auto":
        return backend, f"trainer.backend {backend} (as set)"
    blockers = []
    if _joins_cluster(config.trainer.ray_address):
        blockers.append("the run joins a Ray cluster")
    platform = _platform(config.trainer.device)
    if platform.name != "cpu":
        blockers.append(f"the workers run on {platform.name}, where only Ray workers were measured")
    if placement != "hybrid":
        blockers.append(f"trainer.placement is {placement}: the rollout runs in processes of its own")
    sizes = {
        "actor.world_size": config.actor.world_size,
        "critic.world_size": config.critic.world_size,
        "reward_model.world_size": config.reward_model.world_size,
        "teacher.world_size": config.teacher.world_size,
        "rollout.num_engines": config.rollout.num_engines,
    }
    blockers += [f"{key} is {value}" for key, value in sizes.items() if value != 1]
    if config.environments.roles:
        blockers.append("environments.roles runs roles with another interpreter")
    if blockers:
        return "ray", f"trainer.backend auto -> ray ({'; '.join(blockers)})"
    return "local", (
        "trainer.backend auto -> local: the run is one process's work on a CPU (one rank a role, the HF "
        "rollout inside the actor), so every role runs in this process without Ray, whose own processes and "
        "round trips made the small CPU step 1.2x slower and start-up 20 s longer on two cores "
        "(docs/benchmarks.md); worker restarts (trainer.max_restarts) need trainer.backend=ray"
    )


def choose_rollout_dtype(config: Any) -> tuple[str | None, str | None]:
    """``(dtype, why)`` for ``rollout.dtype``; ``auto``: bfloat16 over an fp32 trainer where the device
    platform takes the fast path (:meth:`~rlcore.api.DevicePlatform.fast_training`: generation in bf16, the
    trainer's fp32 master weights streamed as bf16, as verl runs), else ``model.dtype``. ``why`` is None
    for a value set by the user (no line in the log)."""
    dtype = config.rollout.dtype
    if dtype != "auto":
        return dtype, None
    if config.model.dtype != "float32":
        return config.model.dtype, f"rollout.dtype auto -> {config.model.dtype} (model.dtype)"
    if _joins_cluster(config.trainer.ray_address):
        fast, why = True, "the run joins a Ray cluster, whose workers are taken for accelerators"
    else:
        fast, why = _platform(config.trainer.device).fast_training()
    chosen = "bfloat16" if fast else "float32"
    return chosen, f"rollout.dtype auto -> {chosen} (model.dtype float32): {why}"


def resolve_layout(config: Any, engine: str) -> tuple[Any, list[str]]:
    """``config`` with ``rollout.engine`` set to ``engine`` (already resolved) and ``trainer.placement``,
    ``trainer.backend`` and ``rollout.dtype`` resolved, and the lines saying why: what
    :func:`resolve_auto` and :func:`rlcore.config.load_config` share once the engine is known."""
    placement, why_placement = choose_placement(config, engine)
    backend, why_backend = choose_backend(config, placement)
    dtype, why_dtype = choose_rollout_dtype(config)
    resolved = attrs.evolve(
        config,
        rollout=attrs.evolve(config.rollout, engine=engine, dtype=dtype),
        trainer=attrs.evolve(config.trainer, placement=placement, backend=backend),
    )
    return resolved, [why_placement, why_backend] + ([why_dtype] if why_dtype else [])


def resolve_auto(config: Any) -> tuple[Any, list[str]]:
    """``config`` with ``rollout.engine``, ``trainer.placement``, ``trainer.backend`` and ``rollout.dtype``
    resolved, and the lines saying why."""
    engine, why_engine = choose_rollout(
        config.rollout.engine, config.trainer.device, config.trainer.ray_address
    )
    resolved, notes = resolve_layout(config, engine)
    return resolved, [why_engine, *notes]

"""Building a run's parts from its config: the roles (engines on Ray or in this process, with their
placement), the tokenizer, the seeds."""

from __future__ import annotations

import functools
import random
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rlcore.config.specs import engine_section, engine_spec, role_engine, role_world_size, rollout_spec


def build_roles(config: Any, train_roles: Sequence[str], on_built: Callable[[Any], None]) -> tuple[dict, Any]:
    """Train roles ``train_roles`` and the rollout role, on ``trainer.backend``. ``on_built(handle)`` is
    called for each role and the placement as soon as it exists, so a later failure can shut it down."""
    from rlcore.cluster.roles import make_rollout_role, make_train_role
    from rlcore.envs import role_env_specs
    from rlcore.envs.nodes import check_nodes, py_executable

    backend = config.trainer.backend
    placement = None
    env_specs = role_env_specs(config)
    interpreters = {role: {"py_executable": py_executable(spec)} for role, spec in env_specs.items()}
    if backend == "ray":
        from rlcore.cluster.placement import placement_from_config
        from rlcore.cluster.ray_cluster import start_ray

        # Quiet runs keep workers' output in their log files (rlcore.telemetry.terminal), not on the terminal.
        start_ray(config.trainer.ray_address, log_to_driver=config.trainer.log_level != "quiet")
        # Before any placement or worker: a node without a role's environment stops the run here.
        check_nodes(env_specs)
        placement = placement_from_config(config, [*train_roles, "rollout"])
        placement.create()
        on_built(placement)
    slot = (lambda role: placement.slot(role)) if placement is not None else (lambda role: None)
    # Ray calls are bounded from the driver; local ones run in its thread, which nothing can interrupt.
    ray_options = {"call_timeout_s": config.trainer.call_timeout_s} if backend == "ray" else {}
    builders: dict[str, Callable[[], Any]] = {
        name: functools.partial(
            make_train_role,
            name,
            role_engine(config, name),
            engine_spec(config, name),
            engine_section(config, "train_engines", role_engine(config, name)),
            world_size=role_world_size(config, name),
            backend=backend,
            slot=slot(name),
            device=config.trainer.device,
            balance_batch=config.trainer.balance_batch,
            **ray_options,
            **interpreters.get(name, {}),
        )
        for name in train_roles
    }
    build_rollout = functools.partial(
        make_rollout_role,
        config.rollout.engine,
        rollout_spec(config),
        engine_section(config, "rollout_engines", config.rollout.engine),
        num_engines=config.rollout.num_engines,
        backend=backend,
        slot=slot("rollout"),
        device=config.trainer.device,
        **ray_options,
        **interpreters.get("rollout", {}),
    )
    if backend == "ray" and config.trainer.placement == "hybrid":
        # The rollout is built inside the actor's processes, so after them.
        roles = _construct(builders, True, on_built)
        rollout = build_rollout(host=roles["actor"])
        on_built(rollout)
    else:
        roles = _construct({**builders, "rollout": build_rollout}, backend == "ray", on_built)
        rollout = roles.pop("rollout")
    for role, spec in env_specs.items():
        handle = rollout if role == "rollout" else roles.get(role)
        if handle is not None:
            where = handle.group.ping()[0]
            print(
                f"rlcore: {role}: workers run in environment {spec.name} ({where['prefix']}, transformers "
                f"{where['transformers']})",
                file=sys.stderr,
                flush=True,
            )
    return roles, rollout


def _construct(
    builders: dict[str, Callable[[], Any]], concurrently: bool, on_built: Callable[[Any], None]
) -> dict:
    """Call every builder. On Ray concurrently: each role's actors import torch and load their engine in
    their own processes, and starting all roles together overlaps those seconds. The first failure is
    raised once every builder has finished (the others are handed to ``on_built`` for shutdown)."""
    if not concurrently:
        built = {}
        for name, build in builders.items():
            built[name] = build()
            on_built(built[name])
        return built
    with ThreadPoolExecutor(len(builders), thread_name_prefix="rlcore-build") as pool:
        futures = {name: pool.submit(build) for name, build in builders.items()}
    built, errors = {}, []
    for name, future in futures.items():
        try:
            built[name] = future.result()
            on_built(built[name])
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise errors[0]
    return built


def load_tokenizer(config: Any) -> Any:
    from transformers import AutoTokenizer

    path = config.model.tokenizer_path or config.model.path
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:
        raise ValueError(
            f"could not load a tokenizer from {path!r} (model.tokenizer_path or model.path): "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)

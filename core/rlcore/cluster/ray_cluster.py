"""Starting or joining Ray: embedded by default, a running cluster when an address is given.

``rlcore train`` on a laptop starts a local Ray instance sized to the machine; with
``trainer.ray_address`` (or ``RAY_ADDRESS``) the same command joins a running cluster instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import attrs

from rlcore.envs.spec import HOME_ENV

#: Environment variables every worker process gets from the driver (plugin selection, unbuffered
#: output so a crashing worker's last lines reach its log).
FORWARDED_PREFIXES = ("RLCORE_",)
#: ``RLCORE_*`` variables each node keeps its own of: where that node's environments live.
NODE_LOCAL = frozenset({HOME_ENV})


def forwarded_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The driver's ``RLCORE_*`` variables (``RLCORE_LOAD_PLUGINS``, ``RLCORE_BLOCK_PLUGINS`` ...) plus
    ``PYTHONUNBUFFERED=1`` and ``extra``, for a worker's ``runtime_env``. Read now, so a change to
    ``os.environ`` after Ray started still reaches workers created later."""
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_PREFIXES) and k not in NODE_LOCAL}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


@attrs.define
class RayCluster:
    """The Ray instance this driver is connected to.

    ``started_here``: this process started it (embedded), so :func:`stop_ray` stops it too.
    ``resources``: the cluster's total resources (``CPU``, ``GPU`` ...), ``nodes``: alive node ids.
    """

    address: str
    started_here: bool
    resources: dict[str, float]
    nodes: list[str]

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)


def _describe() -> RayCluster:
    import ray

    context = ray.get_runtime_context()
    address = context.gcs_address
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    return RayCluster(address, _STARTED_HERE.get(address, False), dict(ray.cluster_resources()), nodes)


_STARTED_HERE: dict[str, bool] = {}


def start_ray(
    address: str | None = None,
    num_cpus: float | None = None,
    *,
    num_gpus: float | None = None,
    log_to_driver: bool = True,
    extra_init: Mapping[str, Any] | None = None,
) -> RayCluster:
    """Connect this driver to Ray and describe the cluster.

    - Already connected: nothing changes (tests and notebooks may start Ray themselves).
    - ``address`` (``"auto"``, ``"host:port"``, ``"ray://..."``), else ``RAY_ADDRESS``: join that cluster.
      ``num_cpus``/``num_gpus`` must then be unset (a running cluster's size is its own).
    - Neither: start an embedded local instance. Ray sizes it to the machine (CPUs within cgroup
      limits, GPUs); ``num_cpus``/``num_gpus`` override. Without the dashboard web UI (seconds of start-up).

    Workers get :func:`forwarded_env` through the job's ``runtime_env`` (groups forward it again per
    actor, read at the time each actor starts).
    """
    import ray

    target = address or os.environ.get("RAY_ADDRESS") or None
    joining = bool(target) and target != "local"
    if joining and (num_cpus is not None or num_gpus is not None):
        raise ValueError(
            f"start_ray: num_cpus/num_gpus size a new local instance; joining the running cluster at "
            f"{target!r} takes its size as it is. Drop them, or unset trainer.ray_address/RAY_ADDRESS."
        )
    if ray.is_initialized():
        return _describe()
    kwargs: dict[str, Any] = {
        "runtime_env": {"env_vars": forwarded_env()},
        "log_to_driver": log_to_driver,
        **(extra_init or {}),
    }
    if joining:
        try:
            ray.init(address=target, **kwargs)
        except ConnectionError as exc:
            raise ConnectionError(
                f"could not join the Ray cluster at {target!r} (from "
                f"{'trainer.ray_address' if address else 'RAY_ADDRESS'}): {exc}. Start it with `ray start "
                f"--head`, or leave the address unset to run on an embedded local instance."
            ) from exc
        info = _describe()
        _STARTED_HERE[info.address] = False
        return info
    # address="local": always a new instance of our own, never a cluster Ray might discover by itself.
    ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, **kwargs)
    info = _describe()
    _STARTED_HERE[info.address] = True
    info.started_here = True
    return info


def stop_ray() -> None:
    """Disconnect this driver; an embedded instance it started stops with it (a joined cluster keeps
    running)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()

"""Resource pools (Ray placement groups) and how roles are placed on them.

A :class:`ResourcePool` reserves ``num_bundles`` bundles, one per device: ``{GPU: 1, CPU: c}`` on a
platform whose workers need a Ray resource (``DevicePlatform.ray_resource``), ``{CPU: c}`` on CPU
machines. A role's rank ``r`` runs on bundle ``r`` of its pool and takes ``share`` of that bundle:

``colocated``
    every role (actor, critic, reference, reward model, teacher, rollout) shares one pool; with ``k`` roles each
    takes ``1/k`` of each device, so Ray puts them on the same devices and they time-share them (the
    trainer releases one role's memory by tag before another role's phase).
``split``
    the train roles share one pool; the rollout gets a pool of its own, whole devices.
``hybrid``
    as ``colocated``, but each rollout replica is built inside an actor rank's process (verl's "hybrid
    engine"): it reserves nothing of its own, and loads the actor's weights in memory, without a
    transport (:class:`~rlcore.cluster.ray_group.RayGroup` with a ``host``). Replica ``r`` lives with the
    actor's ``r``-th rank holding full weights; tensor-parallel replicas are not supported there.

A rollout replica with ``tensor_parallel_size = t`` owns bundles ``[i*t, (i+1)*t)`` of its pool; its
worker runs on the first of them; an engine that starts its own device workers (vLLM's Ray executor)
finds its bundles in ``RLCORE_BUNDLE_INDICES`` and the pool in ``ray.util.get_current_placement_group()``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

MODES = ("colocated", "split", "hybrid")
ROLLOUT = "rollout"
#: Bundle indices of a multi-device rollout replica, for engines that start their own device workers.
BUNDLE_INDICES_ENV = "RLCORE_BUNDLE_INDICES"


def _round_down(x: float) -> float:
    # Ray keeps resource amounts to 4 decimals; round down so k shares never add up past a bundle.
    return math.floor(x * 10_000) / 10_000


@attrs.define
class ResourcePool:
    """``num_bundles`` bundles of one device each (``resource``, ``None`` on CPU machines) plus
    ``cpus_per_bundle`` CPUs, reserved as one Ray placement group with ``strategy``."""

    name: str
    num_bundles: int
    resource: str | None = None
    cpus_per_bundle: float = 1.0
    strategy: str = "PACK"
    #: CPU threads (``OMP_NUM_THREADS``) of each worker in a bundle. Ray would give a worker as many as
    #: its fractional CPU reservation rounds to, 1; but the roles colocated in a bundle take turns (the
    #: rollout generates, then the actor trains), so each may use every core the bundle stands for.
    threads_per_bundle: int = 1
    placement_group: Any = attrs.field(default=None, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.num_bundles < 1:
            raise ValueError(f"resource pool {self.name!r} needs at least one bundle, got {self.num_bundles}")
        if self.cpus_per_bundle <= 0 and self.resource is None:
            raise ValueError(f"resource pool {self.name!r}: a CPU-only pool needs cpus_per_bundle > 0")

    def bundles(self) -> list[dict[str, float]]:
        bundle: dict[str, float] = {}
        if self.cpus_per_bundle > 0:
            bundle["CPU"] = self.cpus_per_bundle
        if self.resource:
            bundle[self.resource] = 1.0
        return [dict(bundle) for _ in range(self.num_bundles)]

    def create(self, timeout_s: float = 300.0) -> Any:
        """Reserve the bundles (idempotent); a clear error when the cluster cannot hold them."""
        import ray
        from ray.util.placement_group import placement_group

        if self.placement_group is None:
            self._check_fits(ray.cluster_resources())
            self.placement_group = placement_group(self.bundles(), strategy=self.strategy, name="")
        ready, _ = ray.wait([self.placement_group.ready()], timeout=timeout_s)
        if not ready:
            available = ray.available_resources()
            raise TimeoutError(
                f"resource pool {self.name!r} could not reserve {self.num_bundles} x {self.bundles()[0]} "
                f"({self.strategy}) within {timeout_s:.0f} s; the cluster has {dict(ray.cluster_resources())} "
                f"with {dict(available)} free. Lower the world sizes / rollout engines, or add nodes."
            )
        return self.placement_group

    def _check_fits(self, cluster: Mapping[str, float]) -> None:
        """Fail at once when the whole cluster is too small (rather than wait for resources forever)."""
        for resource, amount in self.bundles()[0].items():
            need = amount * self.num_bundles
            if cluster.get(resource, 0.0) + 1e-9 < need:
                raise RuntimeError(
                    f"resource pool {self.name!r} needs {need:g} {resource} ({self.num_bundles} x "
                    f"{self.bundles()[0]}), but the whole Ray cluster has {cluster.get(resource, 0.0):g}. "
                    f"Lower the world sizes / rollout engines, or run on a larger cluster."
                )

    def actor_options(self, bundle_index: int, share: float) -> dict[str, Any]:
        """Ray ``.options(...)`` that put an actor on bundle ``bundle_index`` taking ``share`` of it."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not 0 <= bundle_index < self.num_bundles:
            raise IndexError(
                f"resource pool {self.name!r} has bundles 0..{self.num_bundles - 1}, not {bundle_index}"
            )
        if self.placement_group is None:
            self.create()
        options: dict[str, Any] = {
            "num_cpus": _round_down(self.cpus_per_bundle * share),
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                self.placement_group, placement_group_bundle_index=bundle_index
            ),
        }
        if self.resource == "GPU":
            options["num_gpus"] = _round_down(share)
        elif self.resource:
            options["resources"] = {self.resource: _round_down(share)}
        return options

    def remove(self) -> None:
        """Give the reservation back to the cluster."""
        if self.placement_group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.placement_group)
            self.placement_group = None


@attrs.define
class PoolSlot:
    """Where one role runs: its pool, the share of each bundle it takes, and ``bundles_per_rank``
    (a rollout replica's tensor-parallel size; 1 for train ranks)."""

    pool: ResourcePool
    share: float = 1.0
    bundles_per_rank: int = 1

    def bundle_of(self, rank: int) -> int:
        return rank * self.bundles_per_rank

    def bundle_indices(self, rank: int) -> list[int]:
        first = self.bundle_of(rank)
        return list(range(first, first + self.bundles_per_rank))

    def actor_options(self, rank: int) -> dict[str, Any]:
        return self.pool.actor_options(self.bundle_of(rank), self.share)


@attrs.define
class Placement:
    """The pools of a run and each role's slot in them."""

    mode: str
    pools: dict[str, ResourcePool]
    slots: dict[str, PoolSlot]

    def slot(self, role: str) -> PoolSlot:
        try:
            return self.slots[role]
        except KeyError:
            raise KeyError(
                f"placement has no slot for role {role!r}; planned roles: {sorted(self.slots)}"
            ) from None

    def create(self, timeout_s: float = 300.0) -> None:
        for pool in self.pools.values():
            pool.create(timeout_s)

    def remove(self) -> None:
        for pool in self.pools.values():
            pool.remove()


def plan_placement(
    mode: str,
    role_sizes: Mapping[str, int],
    *,
    resource: str | None = None,
    total_cpus: float = 1.0,
    rollout_tensor_parallel: int = 1,
    cpus_per_bundle: float | None = None,
    strategy: str = "PACK",
) -> Placement:
    """Pools and slots for roles of the given sizes (devices per role: ranks, or for ``rollout``
    engines x tensor-parallel size).

    ``cpus_per_bundle`` defaults to ``min(1, total_cpus / bundles)`` so that every pool fits the
    cluster's CPUs (``total_cpus``) even on a 2-core machine.
    """
    if mode not in MODES:
        raise ValueError(f"trainer.placement must be one of {', '.join(MODES)}; got {mode!r}")
    bad = {r: n for r, n in role_sizes.items() if int(n) < 1}
    if not role_sizes or bad:
        raise ValueError(f"placement needs roles with at least one device each; got {dict(role_sizes)}")
    tp = int(rollout_tensor_parallel)
    if ROLLOUT in role_sizes and role_sizes[ROLLOUT] % tp:
        raise ValueError(
            f"rollout devices ({role_sizes[ROLLOUT]}) must be a multiple of tensor_parallel_size ({tp})"
        )
    groups: dict[str, list[str]] = {"shared": list(role_sizes)}
    hosted = mode == "hybrid" and ROLLOUT in role_sizes
    if hosted:
        _check_hostable(role_sizes, tp)
        groups = {"shared": [r for r in role_sizes if r != ROLLOUT]}
    if mode == "split":
        groups = {}
        train = [r for r in role_sizes if r != ROLLOUT]
        if train:
            groups["train"] = train
        if ROLLOUT in role_sizes:
            groups[ROLLOUT] = [ROLLOUT]
    sizes = {name: max(int(role_sizes[r]) for r in roles) for name, roles in groups.items()}
    if cpus_per_bundle is None:
        cpus_per_bundle = _round_down(min(1.0, total_cpus / sum(sizes.values())))
    if cpus_per_bundle <= 0 and resource is None:
        raise ValueError(f"{total_cpus} CPUs cannot hold {sum(sizes.values())} bundles")
    # The cores each device's bundle stands for: reservations stay within cpus_per_bundle so that every
    # pool fits, but the threads of the workers sharing a bundle may use the machine's cores.
    threads = max(1, int(total_cpus // sum(sizes.values())))
    pools = {
        name: ResourcePool(name, sizes[name], resource, cpus_per_bundle, strategy, threads_per_bundle=threads)
        for name in groups
    }
    slots = {}
    for name, roles in groups.items():
        for role in roles:
            slots[role] = PoolSlot(pools[name], 1.0 / len(roles), tp if role == ROLLOUT else 1)
    if hosted:  # the rollout takes the actor's processes, so its bundles and share
        slots[ROLLOUT] = slots["actor"]
    return Placement(mode, pools, slots)


def _check_hostable(role_sizes: Mapping[str, int], tp: int) -> None:
    if "actor" not in role_sizes:
        raise ValueError(
            "trainer.placement=hybrid builds the rollout inside the actor's processes: plan an actor"
        )
    if tp != 1:
        raise ValueError(
            f"trainer.placement=hybrid builds each rollout replica inside one actor process, so "
            f"rollout.tensor_parallel_size must be 1 (got {tp}); use trainer.placement=colocated for "
            f"tensor-parallel rollout engines"
        )
    if role_sizes[ROLLOUT] > role_sizes["actor"]:
        raise ValueError(
            f"trainer.placement=hybrid puts each rollout replica in an actor rank's process: "
            f"rollout.num_engines ({role_sizes[ROLLOUT]}) must be at most actor.world_size "
            f"({role_sizes['actor']})"
        )


def role_sizes_from_config(config: Any, roles: Sequence[str]) -> dict[str, int]:
    """Devices each role needs, from an :class:`~rlcore.config.schema.RLConfig`: ``actor`` and
    ``reference`` use ``actor.world_size``, ``critic`` ``critic.world_size``, ``reward_model``
    ``reward_model.world_size``, ``teacher`` ``teacher.world_size``, ``rollout`` ``num_engines *
    tensor_parallel_size``."""
    table = {
        "actor": config.actor.world_size,
        "reference": config.actor.world_size,
        "reward_model": config.reward_model.world_size,
        "teacher": config.teacher.world_size,
        "critic": config.critic.world_size,
        ROLLOUT: config.rollout.num_engines * config.rollout.tensor_parallel_size,
    }
    unknown = [r for r in roles if r not in table]
    if unknown:
        raise ValueError(f"unknown role(s) {unknown}; placement knows {sorted(table)}")
    return {r: int(table[r]) for r in roles}


def cluster_resource(device: str = "auto") -> str | None:
    """The Ray resource that workers of ``trainer.device`` need in the connected cluster.

    ``auto`` picks, among installed platforms whose ``ray_resource`` the cluster offers, the one with the
    highest priority (the driver itself may run on a node without accelerators); ``None`` when the
    cluster has none of them (CPU workers). A named platform is taken as named.
    """
    import ray

    from rlcore.plugins import registry

    platforms = registry("device_platforms")
    if device != "auto":
        return platforms.get(device).ray_resource
    offered = ray.cluster_resources()
    candidates = [platforms.get(n) for n in platforms.names()]
    candidates = [p for p in candidates if p.ray_resource and offered.get(p.ray_resource, 0) > 0]
    return max(candidates, key=lambda p: p.priority).ray_resource if candidates else None


def placement_from_config(config: Any, roles: Sequence[str]) -> Placement:
    """The placement ``trainer.placement`` asks for, for ``roles``, in the connected Ray cluster."""
    import ray

    # load_config and the Trainer resolve ``auto`` knowing the rollout engine; a caller that builds its
    # roles itself gets the layout that assumes nothing about them.
    mode = "colocated" if config.trainer.placement == "auto" else config.trainer.placement
    return plan_placement(
        mode,
        role_sizes_from_config(config, roles),
        resource=cluster_resource(config.trainer.device),
        total_cpus=float(ray.cluster_resources().get("CPU", 1.0)),
        rollout_tensor_parallel=config.rollout.tensor_parallel_size,
    )

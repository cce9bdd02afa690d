"""The single controller: worker groups per role on Ray (or in-process), their placement, and the role
handles an algorithm's control flow calls.

The Ray layer, bottom up: :mod:`.cluster` (start or join Ray), :mod:`.placement` (resource pools as
placement groups; colocated or split), :mod:`.workers` (one engine rank per worker), :mod:`.group` and
:mod:`.ray_group` (all ranks of a role, dispatch by data-parallel rank), :mod:`.roles` (``TrainRole``,
``RolloutRole``, ``sync_weights``), :mod:`.failures` (what a dead or failing worker reports).

Ray is imported only when a Ray group or cluster is used.
"""

from rlcore.controller.cluster import RayCluster, forwarded_env, start_ray, stop_ray
from rlcore.controller.failures import WorkerError, WorkerFailure
from rlcore.controller.group import LocalGroup, Pending, WorkerGroup, wait_all
from rlcore.controller.placement import (
    Placement,
    PoolSlot,
    ResourcePool,
    placement_from_config,
    plan_placement,
    role_sizes_from_config,
)
from rlcore.controller.ray_group import RayGroup
from rlcore.controller.roles import (
    RolloutRole,
    TrainRole,
    make_rollout_role,
    make_train_role,
    sync_weights,
)
from rlcore.controller.workers import RolloutWorker, TrainWorker

__all__ = [
    "LocalGroup",
    "Pending",
    "Placement",
    "PoolSlot",
    "RayCluster",
    "RayGroup",
    "ResourcePool",
    "RolloutRole",
    "RolloutWorker",
    "TrainRole",
    "TrainWorker",
    "WorkerError",
    "WorkerFailure",
    "WorkerGroup",
    "forwarded_env",
    "make_rollout_role",
    "make_train_role",
    "placement_from_config",
    "plan_placement",
    "role_sizes_from_config",
    "start_ray",
    "stop_ray",
    "sync_weights",
    "wait_all",
]

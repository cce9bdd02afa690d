"""Running engines on a cluster: worker groups per role on Ray (or in this process), their placement,
and the role handles an algorithm's control flow calls.

Bottom up: :mod:`.ray_cluster` (start or join Ray), :mod:`.placement` (resource pools as placement
groups; colocated, split or hybrid), :mod:`.wire` (batches across process boundaries),
:mod:`.micro_batching` (a worker's token budget from its device), :mod:`.workers` (one engine rank per
worker), :mod:`.failures` (what a dead or failing worker reports), :mod:`.dispatch` (results in flight,
data-parallel topology, shards: shared by both kinds of group), :mod:`.group` (in-process) and
:mod:`.ray_group` (Ray actors), :mod:`.balance` (even loads across data-parallel ranks), :mod:`.roles`
(``TrainRole``, ``RolloutRole``, ``sync_weights``).

Nothing here knows an algorithm or the training loop. Ray is imported only when a Ray group or cluster
is used.
"""

from rlcore.cluster.dispatch import Pending, wait_all
from rlcore.cluster.failures import WorkerError, WorkerFailure, WorkerTimeout
from rlcore.cluster.group import LocalGroup, WorkerGroup
from rlcore.cluster.placement import (
    Placement,
    PoolSlot,
    ResourcePool,
    placement_from_config,
    plan_placement,
    role_sizes_from_config,
)
from rlcore.cluster.ray_cluster import RayCluster, forwarded_env, start_ray, stop_ray
from rlcore.cluster.ray_group import RayGroup
from rlcore.cluster.roles import (
    RolloutRole,
    TrainRole,
    make_rollout_role,
    make_train_role,
    sync_weights,
)
from rlcore.cluster.workers import RolloutWorker, TrainWorker

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
    "WorkerTimeout",
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

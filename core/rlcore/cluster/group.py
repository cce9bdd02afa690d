"""Worker groups: all ranks of one role, called together.

A group calls a method on every rank (:meth:`WorkerGroup.call_all`), or splits a batch by data-parallel
rank and collects the results from the ranks that hold them (:meth:`WorkerGroup.dispatch`):

- rank ``r`` reports ``(dp_rank, dp_size, holds_output)`` (its engine decides: FSDP ranks are their own
  DP ranks; Megatron's TP/PP peers share a DP rank and only one of them holds outputs);
- ``dispatch`` gives rank ``r`` chunk ``dp_rank(r)`` of ``data.chunk(dp_size)`` (peers get the same
  chunk) and returns one result per DP rank, in DP order: that of the lowest rank holding output for
  it (:attr:`WorkerGroup.output_ranks`); ``None`` results are dropped.

:class:`LocalGroup` (here) runs workers in the driver process (``trainer.backend=local``, debugging);
:class:`~rlcore.cluster.ray_group.RayGroup` runs each rank as a Ray actor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from rlcore.api import Batch, DistInfo, EngineSpec, RolloutSpec
from rlcore.cluster.dispatch import Pending, Topology, shards
from rlcore.cluster.wire import from_wire
from rlcore.cluster.workers import RolloutWorker, TrainWorker, WorkerInfo


@runtime_checkable
class WorkerGroup(Protocol):
    """What roles need from a group of workers, whatever runs them."""

    role: str
    world_size: int
    dp_size: int
    #: the rank whose result stands for each data-parallel rank, in DP order
    output_ranks: list[int]

    def call_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]: ...

    def call_all_async(self, method: str, *args: Any, **kwargs: Any) -> Pending: ...

    def call_rank(self, rank: int, method: str, *args: Any, **kwargs: Any) -> Any: ...

    def dispatch(self, method: str, data: Batch | Sequence[Any], *args: Any, **kwargs: Any) -> list[Any]: ...

    def ping(self) -> list[WorkerInfo]: ...

    def shutdown(self) -> None: ...


class LocalGroup:
    """Workers constructed in this process; calls run one after another.

    Only for roles whose ranks need no process group (``world_size`` 1 for train roles; any number of
    rollout replicas). ``call_all_async`` runs the call before it returns, so a collective weight
    transport (``broadcast``) cannot work here: use Ray.
    """

    def __init__(self, role: str, workers: Sequence[Any]):
        if not workers:
            raise ValueError(f"group {role!r} needs at least one worker")
        self.role, self.workers = role, list(workers)
        self.world_size = len(self.workers)
        self._topology = Topology(role, [w.topology() for w in self.workers])
        self.dp_size = self._topology.dp_size
        self.output_ranks = list(self._topology.output_ranks)

    @classmethod
    def train(
        cls,
        role: str,
        engine_name: str,
        spec: EngineSpec,
        engine_config: Any = None,
        *,
        world_size: int = 1,
        device: str = "auto",
    ) -> LocalGroup:
        if world_size != 1:
            raise ValueError(
                f"trainer.backend=local runs every role in the driver process, so {role} world_size must be 1 "
                f"(got {world_size}); use trainer.backend=ray for several ranks"
            )
        return cls(role, [TrainWorker(role, engine_name, spec, engine_config, DistInfo(), device)])

    @classmethod
    def rollout(
        cls,
        engine_name: str,
        spec: RolloutSpec,
        engine_config: Any = None,
        *,
        num_engines: int = 1,
        device: str = "auto",
    ) -> LocalGroup:
        workers = [
            RolloutWorker(engine_name, spec, engine_config, device, i, num_engines)
            for i in range(num_engines)
        ]
        return cls("rollout", workers)

    def call_rank(self, rank: int, method: str, *args: Any, **kwargs: Any) -> Any:
        return from_wire(self.workers[rank].call(method, *args, **kwargs))

    def call_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return [self.call_rank(r, method, *args, **kwargs) for r in range(self.world_size)]

    def call_all_async(self, method: str, *args: Any, **kwargs: Any) -> Pending:
        results = self.call_all(method, *args, **kwargs)
        return Pending(lambda: results)

    def dispatch(self, method: str, data: Batch | Sequence[Any], *args: Any, **kwargs: Any) -> list[Any]:
        pieces = shards(data, self.dp_size)
        results = [
            self.call_rank(r, method, pieces[self._topology.dp_ranks[r]], *args, **kwargs)
            for r in range(self.world_size)
        ]
        return [results[r] for r in self.output_ranks if results[r] is not None]

    def ping(self) -> list[WorkerInfo]:
        return self.call_all("ping")

    def shutdown(self) -> None:
        for worker in self.workers:
            worker.shutdown()
        self.workers = []

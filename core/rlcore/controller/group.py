"""Worker groups: all ranks of one role, called together.

A group calls a method on every rank (:meth:`WorkerGroup.call_all`), or splits a batch by data-parallel
rank and collects the results from the ranks that hold them (:meth:`WorkerGroup.dispatch`):

- rank ``r`` reports ``(dp_rank, dp_size, holds_output)`` (its engine decides: FSDP ranks are their own
  DP ranks; Megatron's TP/PP peers share a DP rank and only one of them holds outputs);
- ``dispatch`` gives rank ``r`` chunk ``dp_rank(r)`` of ``data.chunk(dp_size)`` (peers get the same
  chunk) and returns one result per DP rank, in DP order: that of the lowest rank holding output for
  it (:attr:`WorkerGroup.output_ranks`); ``None`` results are dropped.

:class:`LocalGroup` (here) runs workers in the driver process (``trainer.backend=local``, debugging);
:class:`~rlcore.controller.ray_group.RayGroup` runs each rank as a Ray actor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from rlcore.api import Batch, DistInfo, EngineSpec, RolloutSpec
from rlcore.controller.wire import from_wire
from rlcore.controller.workers import RolloutWorker, TrainWorker, WorkerInfo


class Pending:
    """Results of a call started on several ranks; :meth:`wait` returns them in rank order."""

    def __init__(self, collect: Callable[[], list[Any]]):
        self._collect = collect
        self._result: list[Any] | None = None

    def wait(self) -> list[Any]:
        if self._result is None:
            self._result = self._collect()
        return self._result


def wait_all(pendings: Sequence[Pending]) -> list[list[Any]]:
    """Wait for several calls at once, so that the first failure in *any* of them is raised at once
    (a sender blocked in a collective with a dead receiver would otherwise hide the receiver's death)."""
    from rlcore.controller.ray_group import RayPending, wait_ray_pendings

    wait_ray_pendings([p for p in pendings if isinstance(p, RayPending)])
    return [p.wait() for p in pendings]


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


class Topology:
    """Each rank's DP coordinate, and which rank's result stands for each DP rank."""

    def __init__(self, role: str, reports: Sequence[tuple[int, int, bool]]):
        sizes = {int(size) for _, size, _ in reports}
        if len(sizes) != 1:
            raise ValueError(f"{role}: ranks disagree on the data-parallel size: {[r[1] for r in reports]}")
        self.dp_size = sizes.pop()
        self.dp_ranks = [int(dp) for dp, _, _ in reports]
        if self.dp_size < 1 or any(not 0 <= d < self.dp_size for d in self.dp_ranks):
            raise ValueError(f"{role}: data-parallel ranks {self.dp_ranks} do not fit dp_size {self.dp_size}")
        self.output_ranks: list[int] = []
        for dp in range(self.dp_size):
            holders = [r for r, (d, _, holds) in enumerate(reports) if d == dp and holds]
            if not holders:
                raise ValueError(
                    f"{role}: no rank holds the output of data-parallel rank {dp} (topology {list(reports)}); "
                    f"the engine's holds_output() must be true on one rank per data-parallel rank"
                )
            self.output_ranks.append(holders[0])


def shards(data: Batch | Sequence[Any], n: int, *, views: bool = False) -> list[Any]:
    """``n`` consecutive pieces of a batch or a list, sizes differing by at most one (some may be
    empty when there are fewer rows than pieces), as :meth:`Batch.chunk` cuts them.

    ``views``: a batch's pieces share memory with it (row slices of contiguous tensors stay
    contiguous), for pieces that are serialised right away; otherwise they are copies.
    """
    if isinstance(data, Batch) and not views:
        return data.chunk(n)
    base, extra = divmod(len(data), n)
    bounds, start = [], 0
    for i in range(n):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    if isinstance(data, Batch):
        return [
            Batch(
                {k: v[a:b] for k, v in data.tensors.items()},
                {k: v[a:b] for k, v in data.objects.items()},
                data.meta,
            )
            for a, b in bounds
        ]
    items = list(data)
    return [items[a:b] for a, b in bounds]


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

"""``RayGroup``: the ranks of one role as Ray actors in a resource pool.

Each rank is an actor (:class:`_RayHost`) on bundle ``slot.bundle_of(rank)`` of its pool, taking
``slot.share`` of it. Start-up, in order: the actors report where they run (pid, node, log files);
rank 0 picks a free port on its node for the engine's process-group rendezvous; every actor builds its
worker (engine from the registry, in its own process) and reports its DP topology.

Never hangs on a dead worker: results are collected by polling ``ray.wait``, and the first dead rank
ends the call with a :class:`~rlcore.cluster.failures.WorkerFailure` (role, rank, phase, the tail of
the worker's log) and stops the group's other actors, which may be blocked in a collective with it.
Never waits forever on a live one either: with ``call_timeout_s`` (the run's ``trainer.call_timeout_s``)
a call still running after that many seconds, building the engine included, ends with a
:class:`~rlcore.cluster.failures.WorkerTimeout` (role, engine and plugin, phase, the stuck ranks, the
first one's log tail) and the group is stopped: its stuck actor would hold every later call behind it.
"""

from __future__ import annotations

import glob
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rlcore.api import Batch, DistInfo, EngineSpec, RolloutSpec
from rlcore.cluster.dispatch import Pending, Topology, shards
from rlcore.cluster.failures import (
    WorkerError,
    WorkerFailure,
    WorkerTimeout,
    death_reason,
    worker_log_tail,
)
from rlcore.cluster.neutral import auditing, check_neutral
from rlcore.cluster.placement import BUNDLE_INDICES_ENV, PoolSlot, ResourcePool, cluster_resource
from rlcore.cluster.ray_cluster import forwarded_env, start_ray
from rlcore.cluster.wire import from_wire, to_wire
from rlcore.cluster.workers import RolloutWorker, TrainWorker, WorkerInfo, free_port, where_am_i
from rlcore.devices import apply_ray_device_env
from rlcore.telemetry.terminal import LOG_DIR_ENV, redirect_output, worker_log_name

#: Seconds the other ranks get to finish after one rank's method raised, before the group is presumed
#: stuck in a collective with the failed rank and stopped.
ERROR_GRACE_S = 10.0
#: CPUs each rank of a group without a pool slot reserves.
STANDALONE_CPUS_PER_RANK = 0.1


class _RayHost:
    """The Ray actor around a worker. Building the worker is a method call, not the actor's
    ``__init__``: the host reports its pid and log files first, so a worker that crashes while building
    its engine still gets a report with its log, and an exception there arrives as a task error.

    A host may hold workers of several roles, by role name: with ``trainer.placement=hybrid`` a rollout
    replica is built inside an actor rank's process (:class:`RayGroup`'s ``host``)."""

    def __init__(self, role: str, rank: int):
        self.role, self.rank = role, rank
        self.workers: dict[str, Any] = {}
        log_dir = os.environ.get(LOG_DIR_ENV)
        if log_dir:  # a quiet run: this worker's whole output goes to the run's logs folder
            redirect_output(Path(log_dir) / worker_log_name(role, rank))

    def __repr__(self) -> str:  # Ray prefixes the worker's output lines with this
        return f"{self.role}:{self.rank}"

    def where(self) -> WorkerInfo:
        return where_am_i(self.role, self.rank)

    def free_port(self) -> int:
        return free_port()

    def construct(
        self, key: str, worker_cls: type, kwargs: dict[str, Any], env: dict[str, str]
    ) -> tuple[int, int, bool]:
        # torch.distributed's env:// rendezvous and some engines read these rather than DistInfo.
        os.environ.update(env)
        # The platform's mapping of Ray's device ids to its visible-devices variables, before the worker
        # chooses its platform (which starts the device runtime): LOCAL_RANK 0 relies on it.
        apply_ray_device_env(kwargs.get("device", "auto"))
        self.workers[key] = worker_cls(**kwargs)
        return self.workers[key].topology()

    def call(self, key: str, method: str, *args: Any, **kwargs: Any) -> Any:
        if not auditing():
            return self.workers[key].call(method, *args, **kwargs)
        try:
            out = self.workers[key].call(method, *args, **kwargs)
        except Exception as exc:
            check_neutral(exc, f"the error of {key}.{method}")
            raise
        check_neutral(out, f"the result of {key}.{method}")
        return out


_HOST_CLASS = None


def _host_class():
    global _HOST_CLASS
    if _HOST_CLASS is None:
        import ray

        _HOST_CLASS = ray.remote(max_restarts=0)(_RayHost)
    return _HOST_CLASS


class RayPending(Pending):
    """A call in flight on some ranks of a :class:`RayGroup`."""

    def __init__(
        self,
        group: RayGroup,
        refs: list[Any],
        phase: str,
        ranks: list[int],
        timeout_s: float | None,
        setting: str = "trainer.call_timeout_s",
    ):
        super().__init__(self._collect)
        self.group, self.phase, self.ranks = group, phase, ranks
        self.position = {ref: i for i, ref in enumerate(refs)}
        self.out: list[Any] = [None] * len(refs)
        self.remaining = list(refs)
        self.timeout_s, self.setting = timeout_s, setting  # setting: what a user raises when only slow
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def take(self, ref: Any) -> None:
        """Store the result of finished ``ref``, or raise its rank's failure."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        self.remaining.remove(ref)
        i = self.position[ref]
        try:
            self.out[i] = from_wire(ray.get(ref))
        except RayActorError as exc:
            self.group._fail(self.ranks[i], self.phase, exc)
        except RayTaskError as exc:
            self.group._raise_worker_error(self.ranks[i], self.phase, exc, self)

    def late(self) -> bool:
        """Whether this call is still running past its deadline."""
        return bool(self.remaining) and self.deadline is not None and time.monotonic() >= self.deadline

    def check_deadline(self) -> None:
        """Past the deadline: stop the group and raise its :class:`WorkerTimeout`."""
        if self.late():
            raise self.time_out()

    def time_out(self) -> WorkerTimeout:
        stuck = sorted(self.ranks[self.position[r]] for r in self.remaining)
        return self.group._time_out(stuck, self.phase, self.timeout_s, self.setting)

    def _collect(self) -> list[Any]:
        wait_ray_pendings([self])
        return self.out

    @classmethod
    def wait_together(cls, pendings: Sequence[Pending]) -> None:
        wait_ray_pendings(pendings)


def wait_ray_pendings(pendings: Sequence[RayPending]) -> None:
    """Poll all refs of ``pendings`` together until every one is taken (or one fails)."""
    import ray

    owner = {ref: p for p in pendings for ref in p.remaining}
    poll_s = min((p.group.poll_s for p in pendings), default=1.0)
    while owner:
        late = [p for p in pendings if p.late()]
        if (
            late
        ):  # every late group is stopped (a sender and its receivers hang together); the first is raised
            errors = [p.time_out() for p in late]
            for other in errors[1:]:
                errors[0].add_note(f"meanwhile: {str(other).splitlines()[0]}")
            raise errors[0]
        ready, _ = ray.wait(list(owner), num_returns=1, timeout=poll_s)
        for ref in ready:
            owner.pop(ref).take(ref)


class RayGroup:
    """``world_size`` Ray actors hosting ``worker_cls`` ranks, placed by ``slot``. ``worker_kwargs(rank,
    dist)`` gives rank ``rank`` its constructor arguments; ``dist`` carries the rendezvous (rank 0's
    node, a free port there). ``env_vars`` are set in every worker, besides :func:`forwarded_env`.

    Without a ``slot`` the group reserves a pool of its own (removed at :meth:`shutdown`): one bundle per
    rank of one ``resource`` device (``None``: none) and :data:`STANDALONE_CPUS_PER_RANK` CPUs, small so
    that several such groups fit on one machine; a run sizes its pools with
    :func:`~rlcore.cluster.placement.placement_from_config` instead. Calls poll
    every ``poll_s`` seconds for dead ranks; ``call_timeout_s`` (``None``: no limit) bounds any call, the
    engine's construction included. ``engine`` names the engine and its plugin in the messages.
    ``py_executable``: the command the actors' Python starts with (a role's environment,
    :func:`rlcore.envs.nodes.py_executable`); ``None``: the driver's interpreter.

    Given a ``host`` group, the ranks are built inside its actors instead (``trainer.placement=hybrid``:
    rank ``r`` in the process of the host's ``r``-th output rank, in its slot); such a group stops no
    actors at :meth:`shutdown` (the host owns them), only its own workers.
    """

    def __init__(
        self,
        role: str,
        worker_cls: type,
        worker_kwargs: Callable[[int, DistInfo], dict[str, Any]],
        world_size: int,
        *,
        slot: PoolSlot | None = None,
        resource: str | None = None,
        env_vars: dict[str, str] | None = None,
        start_timeout_s: float = 600.0,
        call_timeout_s: float | None = None,
        poll_s: float = 1.0,
        host: RayGroup | None = None,
        engine: str = "",
        py_executable: str | None = None,
    ):
        if world_size < 1:
            raise ValueError(f"group {role!r} needs world_size >= 1, got {world_size}")
        start_ray()
        self.role, self.world_size = role, world_size
        self.call_timeout_s, self.poll_s, self.engine = call_timeout_s, poll_s, engine
        #: the interpreter the actors start with (an environment's, rlcore.envs); None: the driver's
        self.py_executable = py_executable
        self._failure: WorkerFailure | WorkerTimeout | None = None
        self._info: list[WorkerInfo] = [{} for _ in range(world_size)]
        self._actors: list[Any] = []
        self._built = False
        self._owned_pool: ResourcePool | None = None
        #: the group whose actors host this one's workers; None: actors of its own
        self.host = host
        if host is not None:
            slot = host.slot
        elif slot is None:
            self._owned_pool = ResourcePool(f"{role}-pool", world_size, resource, STANDALONE_CPUS_PER_RANK)
            slot = PoolSlot(self._owned_pool)
        self.slot = slot
        try:
            if host is None:
                self._start(worker_cls, worker_kwargs, env_vars, start_timeout_s)
            else:
                self._start_in(host, worker_cls, worker_kwargs)
        except BaseException:
            self.shutdown()
            raise

    def _start(self, worker_cls, worker_kwargs, env_vars, start_timeout_s) -> None:
        self.slot.pool.create(start_timeout_s)
        host, env = _host_class(), forwarded_env(env_vars)
        if "OMP_NUM_THREADS" not in os.environ:  # the user's own setting wins
            env.setdefault("OMP_NUM_THREADS", str(self.slot.pool.threads_per_bundle))
        for rank in range(self.world_size):
            options = self.slot.actor_options(rank)
            bundles = ",".join(map(str, self.slot.bundle_indices(rank)))
            options["runtime_env"] = {"env_vars": {**env, BUNDLE_INDICES_ENV: bundles}}
            if self.py_executable:
                options["runtime_env"]["py_executable"] = self.py_executable
            self._actors.append(host.options(**options).remote(self.role, rank))
        self._info = self._wait([a.where.remote() for a in self._actors], "start", start_timeout_s)
        master_addr = self._info[0].get("node_ip") or "127.0.0.1"
        master_port = self._wait([self._actors[0].free_port.remote()], "start", start_timeout_s, [0])[0]
        refs = []
        for rank, actor in enumerate(self._actors):
            dist = DistInfo(rank, self.world_size, 0, master_addr, master_port)
            rank_env = {
                "RANK": str(rank),
                "WORLD_SIZE": str(self.world_size),
                "LOCAL_RANK": "0",  # Ray shows each actor only its own device(s)
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
            }
            refs.append(actor.construct.remote(self.role, worker_cls, worker_kwargs(rank, dist), rank_env))
        self._set_topology(self._wait(refs, "__init__", self.call_timeout_s))

    def _set_topology(self, reports: list[tuple[int, int, bool]]) -> None:
        self._topology = Topology(self.role, reports)
        self.dp_size = self._topology.dp_size
        self.output_ranks = list(self._topology.output_ranks)
        self._built = True

    def _start_in(self, host: RayGroup, worker_cls, worker_kwargs) -> None:
        """Build rank ``r`` inside the process of ``host``'s output rank ``r`` (a rank that exports the
        full weights): the two roles share those processes, their memory and their devices, and calls to
        either run one at a time there."""
        host._check_usable()
        if self.world_size > len(host.output_ranks):
            raise ValueError(
                f"{self.role}: {self.world_size} replica(s) cannot live in the processes of {host.role}, which "
                f"has {len(host.output_ranks)} rank(s) holding full weights ({host.output_ranks}); with "
                f"trainer.placement=hybrid use at most that many rollout.num_engines"
            )
        ranks = host.output_ranks[: self.world_size]
        self._actors = [host._actors[r] for r in ranks]
        self._info = [dict(host._info[r], role=self.role, rank=i) for i, r in enumerate(ranks)]
        refs = [
            actor.construct.remote(self.role, worker_cls, worker_kwargs(i, DistInfo(i, self.world_size)), {})
            for i, actor in enumerate(self._actors)
        ]
        self._set_topology(self._wait(refs, "__init__", self.call_timeout_s))

    # -- constructors for the two worker kinds ----------------------------------------------------
    @classmethod
    def train(
        cls,
        role: str,
        engine_name: str,
        spec: EngineSpec,
        engine_config: Any = None,
        *,
        world_size: int = 1,
        slot: PoolSlot | None = None,
        device: str = "auto",
        **options: Any,
    ) -> RayGroup:
        """A train role: ``world_size`` :class:`TrainWorker` ranks of engine ``engine_name``."""

        def kwargs(rank: int, dist: DistInfo) -> dict[str, Any]:
            return {
                "role": role,
                "engine_name": engine_name,
                "spec": spec,
                "engine_config": engine_config,
                "dist": dist,
                "device": device,
            }

        options.setdefault("engine", _engine_source("train_engines", engine_name))
        return cls(role, TrainWorker, kwargs, world_size, slot=slot, **_standalone(slot, device, options))

    @classmethod
    def rollout(
        cls,
        engine_name: str,
        spec: RolloutSpec,
        engine_config: Any = None,
        *,
        num_engines: int = 1,
        slot: PoolSlot | None = None,
        device: str = "auto",
        host: RayGroup | None = None,
        **options: Any,
    ) -> RayGroup:
        """The rollout role: ``num_engines`` :class:`RolloutWorker` replicas, in actors of their own or,
        given ``host``, inside its actors."""

        def kwargs(rank: int, dist: DistInfo) -> dict[str, Any]:
            return {
                "engine_name": engine_name,
                "spec": spec,
                "engine_config": engine_config,
                "device": device,
                "replica": rank,
                "num_replicas": num_engines,
            }

        options.setdefault("engine", _engine_source("rollout_engines", engine_name))
        if host is not None:
            return cls("rollout", RolloutWorker, kwargs, num_engines, host=host, **options)
        return cls(
            "rollout", RolloutWorker, kwargs, num_engines, slot=slot, **_standalone(slot, device, options)
        )

    # -- calls ------------------------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self._failure is not None:
            raise self._failure
        if not self._built:
            raise RuntimeError(f"group {self.role!r} was shut down")

    def _wait(self, refs: list[Any], phase: str, timeout_s: float | None = None, ranks=None) -> list[Any]:
        ranks = list(range(len(refs))) if ranks is None else ranks
        setting = "RayGroup's start_timeout_s" if phase == "start" else "trainer.call_timeout_s"
        return RayPending(self, refs, phase, ranks, timeout_s, setting).wait()

    def _submit(self, ranks: Sequence[int], method: str, args: tuple, kwargs: dict) -> RayPending:
        self._check_usable()
        args = tuple(to_wire(a) for a in args)
        kwargs = {k: to_wire(v) for k, v in kwargs.items()}
        if auditing():
            check_neutral((args, kwargs), f"the arguments of {self.role}.{method}")
        refs = [self._actors[r].call.remote(self.role, method, *args, **kwargs) for r in ranks]
        return RayPending(self, refs, method, list(ranks), self.call_timeout_s)

    def call_all_async(self, method: str, *args: Any, **kwargs: Any) -> RayPending:
        return self._submit(range(self.world_size), method, args, kwargs)

    def call_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return self.call_all_async(method, *args, **kwargs).wait()

    def call_rank(self, rank: int, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._submit([rank], method, args, kwargs).wait()[0]

    def dispatch(self, method: str, data: Batch | Sequence[Any], *args: Any, **kwargs: Any) -> list[Any]:
        import ray

        self._check_usable()
        # One object per shard, serialised straight from views of the batch (no intermediate copy);
        # data-parallel peers (TP/PP ranks) read the same object.
        pieces = [to_wire(piece) for piece in shards(data, self.dp_size, views=True)]
        args = tuple(to_wire(a) for a in args)
        kwargs = {k: to_wire(v) for k, v in kwargs.items()}
        if auditing():
            check_neutral((pieces, args, kwargs), f"the arguments of {self.role}.{method}")
        pieces = [ray.put(piece) for piece in pieces]
        refs = [
            actor.call.remote(self.role, method, pieces[self._topology.dp_ranks[r]], *args, **kwargs)
            for r, actor in enumerate(self._actors)
        ]
        results = RayPending(self, refs, method, list(range(self.world_size)), self.call_timeout_s).wait()
        return [results[r] for r in self.output_ranks if results[r] is not None]

    def ping(self) -> list[WorkerInfo]:
        """Where each rank runs (host, pid, Ray node id and IP, log files)."""
        return self.call_all("ping")

    # -- failures ---------------------------------------------------------------------------------
    def _raise_worker_error(self, rank: int, phase: str, exc: BaseException, pending: RayPending) -> None:
        """Raise a method's error as a :class:`WorkerError`; stop the group if its other ranks do not
        finish soon after (they are likely blocked in a collective with the failed rank). A peer that
        died meanwhile is reported instead, as the likely cause."""
        import ray
        from ray.exceptions import RayActorError

        cause = getattr(exc, "cause", None)
        if isinstance(cause, WorkerError):
            error = cause
        else:
            error = WorkerError(self.role, rank, phase, f"{type(cause).__name__}: {cause}", str(exc))
        if pending.remaining:
            left = list(pending.remaining)
            ready, still = ray.wait(left, num_returns=len(left), timeout=ERROR_GRACE_S)
            for ref in ready:
                try:
                    ray.get(ref)
                except RayActorError as dead:  # a peer died: that is the cause, this error its effect
                    try:
                        self._fail(pending.ranks[pending.position[ref]], phase, dead)
                    except WorkerFailure as failure:
                        failure.add_note(f"meanwhile rank {rank} raised {error.detail}")
                        raise
                except Exception:  # the peer's own error, or its result: the first error stands
                    pass
            if still:
                stuck = sorted(pending.ranks[pending.position[r]] for r in still)
                error.add_note(
                    f"rank(s) {stuck} of {self.role} were still in {phase} {ERROR_GRACE_S:.0f} s later, "
                    f"presumably waiting in a collective for rank {rank}; the group was stopped"
                )
                self._failure = WorkerFailure(
                    self.role, rank, phase, f"a method raised: {error.detail}", self._info[rank]
                )
                self._kill()
        raise error from None

    def _fail(self, rank: int, phase: str, exc: BaseException) -> None:
        """Rank ``rank`` died: build the report, stop the other ranks, raise."""
        where = dict(self._info[rank]) if rank < len(self._info) else {}
        if not where.get("stderr_path"):
            where.update(_log_files_by_pid(str(exc)))
        tail, note = worker_log_tail(where)
        self._failure = WorkerFailure(self.role, rank, phase, death_reason(exc), where, tail, note)
        self._kill()
        raise self._failure from None

    def _time_out(self, ranks: list[int], phase: str, timeout_s: float, setting: str) -> WorkerTimeout:
        """Ranks ``ranks`` are still in ``phase`` past the call's timeout: stop the group (a stuck actor
        holds every later call behind it) and return the error, with the first stuck rank's log tail."""
        where = self._info[ranks[0]] if ranks and ranks[0] < len(self._info) else {}
        tail, note = worker_log_tail(where)
        self._failure = WorkerTimeout(self.role, ranks, phase, timeout_s, self.engine, tail, note, setting)
        self._kill()
        return self._failure

    def _kill(self) -> None:
        import ray

        for actor in self._actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already gone
                pass

    def shutdown(self) -> None:
        """Let each worker close its engine (10 s at most), then stop the actors and free an owned pool."""
        import ray

        if self._built and self._failure is None:
            refs = [actor.call.remote(self.role, "shutdown") for actor in self._actors]
            ray.wait(refs, num_returns=len(refs), timeout=10)
        if self.host is None:  # a hosted group's actors belong to its host
            self._kill()
        self._actors, self._built = [], False
        if self._owned_pool is not None:
            self._owned_pool.remove()
            self._owned_pool = None


def _standalone(slot: PoolSlot | None, device: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` plus, for a group without a slot, the device resource its own pool reserves."""
    if slot is None and "resource" not in options:
        start_ray()
        options = {**options, "resource": cluster_resource(device)}
    return options


def _engine_source(kind: str, name: str) -> str:
    """``engine 'x' from plugin 'y' (package version)``, as the workers' own errors name their engine;
    ``engine 'x'`` when the driver does not know it (the worker then reports that)."""
    from rlcore.cluster.workers import engine_source
    from rlcore.plugins import registry

    entries = registry(kind)
    return engine_source(entries.entry(name)) if name in entries else f"engine {name!r}"


def _log_files_by_pid(message: str) -> dict[str, Any]:
    """For a worker that died before reporting its log files: find them by the pid in Ray's error text
    (in this driver's session directory; on one machine every node writes there)."""
    match = re.search(r"pid[=:]\s*(\d+)", message)
    if not match:
        return {}
    pid = match.group(1)
    found: dict[str, Any] = {"pid": int(pid)}
    try:
        import ray

        session = ray._private.worker._global_node.get_session_dir_path()
    except Exception:  # Ray moved its private API: Ray's own message is still in the report
        return found
    for stream, suffix in (("stdout_path", "out"), ("stderr_path", "err")):
        files = glob.glob(os.path.join(session, "logs", f"worker-*-{pid}.{suffix}"))
        if files:
            found[stream] = files[0]
    return found

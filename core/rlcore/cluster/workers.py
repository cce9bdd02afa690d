"""Workers: one engine rank (or rollout replica) each, in whatever process hosts them.

A worker class is a plain Python class. :class:`~rlcore.cluster.group.LocalGroup` constructs it in
the driver process (``trainer.backend=local``); :class:`~rlcore.cluster.ray_group.RayGroup` builds each
instance inside a Ray actor of its own. Either way the worker resolves its platform and its
engine class from the registries **in its own process**, so plugins load in every Ray worker the same
way they load on the driver.

One role per class: :class:`TrainWorker` hosts a train-engine rank (actor, critic, reference, reward
model are engine configurations), :class:`RolloutWorker` a rollout replica.

Every public method that fails raises :class:`~rlcore.cluster.failures.WorkerError` naming the role,
rank and method. Groups call methods through :meth:`call`, which also carries batches across Ray without
pickling tensors (:mod:`rlcore.cluster.wire`) and records how long each method took (``timings``).
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import socket
import sys
import time
import traceback
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rlcore.api import (
    Batch,
    Completion,
    DistInfo,
    EngineSpec,
    RolloutSpec,
    SamplingParams,
    check_quantization,
)
from rlcore.cluster import micro_batching
from rlcore.cluster.failures import WorkerError
from rlcore.cluster.wire import from_wire, to_wire
from rlcore.testing.faults import maybe_skip_weights

#: Where a worker process is: what :meth:`ping` returns, and what a failure report quotes.
WorkerInfo = dict[str, Any]


def reports_phase(method):
    """Re-raise any exception of ``method`` as a :class:`WorkerError` naming role, rank and method."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except WorkerError:
            raise
        except Exception as exc:
            raise WorkerError(
                getattr(self, "role", type(self).__name__),
                getattr(self, "rank", -1),
                method.__name__,
                f"{type(exc).__name__}: {exc}",
                traceback.format_exc(),
                getattr(self, "engine_source", ""),
            ) from exc

    return wrapper


def engine_source(entry: Any) -> str:
    """``engine 'acme' from plugin 'acme' (rlcore-acme 0.2.0)``: what a worker's errors say of its engine."""
    from rlcore.plugins import get_plugin_manager

    info = get_plugin_manager().plugins.get(entry.plugin)
    package = " ".join(p for p in (info.distribution, info.version) if p) if info else ""
    return f"engine {entry.name!r} from plugin {entry.plugin!r}" + (f" ({package})" if package else "")


def _stream_path(fd: int) -> str | None:
    """The file behind ``fd`` (Ray points worker stdout/stderr at per-worker log files), if a file."""
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc (macOS) or closed fd
        return None
    return path if os.path.isfile(path) else None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _ray_identity() -> dict[str, Any]:
    """Ray node, placement group and resources of this process (``None`` outside a Ray worker)."""
    identity = {"node_id": None, "node_ip": None, "placement_group": None, "resources": None}
    if "ray" not in sys.modules:
        return identity
    import ray

    if not ray.is_initialized():
        return identity
    context = ray.get_runtime_context()
    identity.update(node_id=context.get_node_id(), node_ip=ray.util.get_node_ip_address())
    try:  # only a worker process has these
        identity.update(
            placement_group=context.get_placement_group_id(), resources=context.get_assigned_resources()
        )
    except Exception:
        pass
    return identity


def free_port() -> int:
    """A TCP port free on this host right now (for a process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def where_am_i(role: str, rank: int) -> WorkerInfo:
    """Role, rank, host, pid, Ray node and the files holding this process's stdout/stderr."""
    return {
        "role": role,
        "rank": rank,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        # Which environment (rlcore.envs): the interpreter's prefix and its transformers, read from metadata.
        "prefix": sys.prefix,
        "transformers": _version("transformers"),
        **_ray_identity(),
        "stdout_path": _stream_path(1),
        "stderr_path": _stream_path(2),
    }


class _ProcessProfile:
    """The one ``torch.profiler`` session of this process and how many workers use it."""

    profiler: Any = None
    events: Any = None
    users: int = 0


_PROFILE = _ProcessProfile()


class _ProcessRollout:
    """The rollout replica built in this process, if any: with ``trainer.placement=hybrid`` it lives in an
    actor rank's process, and that rank loads its weights without a transport (:meth:`TrainWorker.sync_local_rollout`)."""

    worker: RolloutWorker | None = None


_LOCAL_ROLLOUT = _ProcessRollout()


#: Whether this process's workers may be told to die or hang on cue (``RLCORE_TEST_DIE``,
#: ``RLCORE_TEST_HANG``: rlcore.testing.faults).
_FAULT_ON_CUE = bool(os.environ.get("RLCORE_TEST_DIE") or os.environ.get("RLCORE_TEST_HANG"))


class Worker:
    """What every worker has: identity, :meth:`call`, :meth:`ping`, per-method timings.

    A worker class subclasses it, calls :meth:`_start` first in ``__init__``, and provides
    ``topology() -> (dp_rank, dp_size, holds_output)`` for its group.
    """

    role: str
    rank: int

    def _start(self, role: str, rank: int) -> None:
        self.role, self.rank = role, rank
        #: method name -> seconds its last call took inside this worker
        self.timings: dict[str, float] = {}
        #: weight transports by name, kept between syncs (a collective one holds a process group)
        self._transports: dict[str, Any] = {}
        # Ray captures worker output into log files; line-buffer it so a crash loses no printed line.
        for stream in (sys.stdout, sys.stderr):
            reconfigure = getattr(stream, "reconfigure", None)
            if reconfigure is not None:
                try:
                    reconfigure(line_buffering=True)
                except (ValueError, OSError):  # not a text stream we may reconfigure
                    pass

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run public ``method`` with arguments that may be wire-packed; pack a :class:`Batch` result.
        Any exception becomes a :class:`WorkerError` naming role, rank and ``method``."""
        if method.startswith("_") or not callable(getattr(self, method, None)):
            raise WorkerError(self.role, self.rank, method, f"{type(self).__name__} has no method {method!r}")
        if _FAULT_ON_CUE:  # the tests of a worker's death or hang (rlcore.testing.faults)
            from rlcore.testing.faults import maybe_die, maybe_hang

            maybe_die(self.role, self.rank, method)
            maybe_hang(self.role, self.rank, method)
        args = tuple(from_wire(a) for a in args)
        kwargs = {k: from_wire(v) for k, v in kwargs.items()}
        start = time.perf_counter()
        out = reports_phase(getattr(type(self), method))(self, *args, **kwargs)
        self.timings[method] = time.perf_counter() - start
        return to_wire(out)

    def ping(self) -> WorkerInfo:
        """Role, rank, host, pid, Ray node and the files holding this worker's stdout/stderr."""
        return where_am_i(self.role, self.rank)

    def free_port(self) -> int:
        """A free TCP port on this worker's host (rendezvous of a weight-transport group)."""
        return free_port()

    def profile_start(self) -> None:
        """Start ``torch.profiler`` over this process (host and device activity) until
        :meth:`profile_stop`. Workers sharing a process (the local backend) share one profiler."""
        if _PROFILE.users == 0:
            from torch.profiler import profile, supported_activities

            _PROFILE.profiler = profile(activities=supported_activities())
            _PROFILE.profiler.__enter__()
            _PROFILE.events = None
        _PROFILE.users += 1

    def profile_stop(self, folder: str) -> str:
        """Stop the profiler; write the 40 operators with the most self device time (CPU time where no
        device was profiled) to ``folder/<role>-<rank>.txt`` and return that path. In a shared process
        every worker writes the process's table."""
        if _PROFILE.events is None:
            _PROFILE.profiler.__exit__(None, None, None)
            _PROFILE.events = _PROFILE.profiler.key_averages()
        events = _PROFILE.events
        _PROFILE.users -= 1
        if _PROFILE.users == 0:
            _PROFILE.profiler = _PROFILE.events = None
        on_device = any(getattr(e, "self_device_time_total", 0) for e in events)
        sort_by = "self_device_time_total" if on_device else "self_cpu_time_total"
        path = Path(folder) / f"{self.role}-{self.rank}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(events.table(sort_by=sort_by, row_limit=40))
        return str(path)

    def ipc_handles_supported(self) -> bool:
        """Whether this worker's device memory can be opened by another process by handle (the ``ipc``
        weight transport)."""
        return self.platform.ipc_handles_supported()

    def memory_separate_from_host(self) -> bool:
        """Whether releasing state to host memory frees this worker's device for colocated roles."""
        return self.platform.memory_separate_from_host()

    def _transport(self, name: str, config: Any) -> Any:
        """This worker's instance of weight transport ``name`` (kept: some hold a process group)."""
        from rlcore.transports import build_transport

        if name not in self._transports:
            self._transports[name] = build_transport(transport_config_for(name, config), self.platform)
        return self._transports[name]

    def _close_transports(self) -> None:
        transports, self._transports = self._transports, {}
        for transport in transports.values():
            close = getattr(transport, "close", None)
            if callable(close):
                close()

    def last_timings(self) -> dict[str, float]:
        """Seconds the last call of each method took inside this worker (benchmarks read this)."""
        return dict(self.timings)


def _engine_config(entry: Any, engine_cls: type, config: Any) -> Any:
    """``config`` as given, or the engine's config class with its defaults when ``None``."""
    if config is not None:
        return config
    config_cls = entry.options.get("config") or getattr(engine_cls, "config_class", None)
    return config_cls() if config_cls is not None else None


class TrainWorker(Worker):
    """Hosts one rank of a :class:`~rlcore.api.TrainEngine` for role ``role`` (actor, critic, ...).

    The engine rendezvous its process group at ``dist.master_addr:master_port`` (the group chose them).
    """

    @reports_phase
    def __init__(
        self,
        role: str,
        engine_name: str,
        spec: EngineSpec,
        engine_config: Any = None,
        dist: DistInfo | None = None,
        device: str = "auto",
    ):
        from rlcore.devices import get_platform
        from rlcore.plugins import registry

        dist = dist or DistInfo()
        self._start(role, dist.rank)
        self.dist = dist
        self.platform = get_platform(device)
        entry = registry("train_engines").entry(engine_name)
        self.engine_source = engine_source(entry)
        engine_cls = entry.load()
        if spec.lora is not None and not getattr(engine_cls, "supports_lora", False):
            raise ValueError(
                f"actor.lora.rank={spec.lora.rank}: train engine {entry.label} does not train LoRA adapters "
                "(TrainEngine.supports_lora is False); use --engine fsdp, or set actor.lora.rank=0 to train "
                "the full model"
            )
        config = _engine_config(entry, engine_cls, engine_config)
        choose = getattr(engine_cls, "choose_settings", None)
        #: what the engine's ``auto`` settings became on this device, and why (:meth:`settings_notes`)
        self.notes: list[str] = []
        if choose is not None:
            config, self.notes = choose(spec, config, self.platform, dist.world_size)
        for note in self.notes:  # stderr: this worker's log file (the driver's, on the local backend)
            print(f"rlcore: {role}: {note}", file=sys.stderr, flush=True)
        activation_dtype = getattr(engine_cls, "activation_dtype", None)
        spec = micro_batching.resolve(
            spec,
            device_bytes=self.platform.memory_stats()["total_gib"] * 2**30,
            shards=dist.world_size,
            activation_dtype=activation_dtype(spec, config) if activation_dtype else spec.dtype,
        )
        self.engine = engine_cls(spec, config, self.platform, dist)

    @reports_phase
    def topology(self) -> tuple[int, int, bool]:
        """``(dp_rank, dp_size, holds_output)``: which shard this rank gets, and whether it returns results."""
        dp_rank, dp_size = self.engine.dp_rank_and_size()
        return int(dp_rank), int(dp_size), bool(self.engine.holds_output())

    def settings_notes(self) -> list[str]:
        """What the engine's ``auto`` settings became on this rank's device, and why (one line each)."""
        return list(getattr(self, "notes", ()))

    @reports_phase
    def train_step(self, batch: Batch, loss_fn: Any) -> dict[str, float]:
        return self.engine.train_step(batch, loss_fn)

    @reports_phase
    def infer(self, batch: Batch, outputs: Sequence[str] = ("log_probs",)) -> Batch | None:
        return self.engine.infer(batch, tuple(outputs))

    @reports_phase
    def join_weight_group(
        self,
        transport: str,
        transport_config: Any,
        sender_rank: int,
        world_size: int,
        master_addr: str,
        port: int,
    ) -> None:
        """Join a collective transport's group as its sender (rank 0) if this is ``sender_rank``;
        the other ranks of the role take no part in it."""
        if self.rank == sender_rank:
            self._transport(transport, transport_config).init_group(0, world_size, master_addr, port)

    def _export(self, dtype: str, bucket_bytes: int, adapter: bool) -> Iterator[Any]:
        """The weight stream a sync sends: the LoRA adapter alone (``adapter``) or the full weights."""
        export = self.engine.export_adapter if adapter else self.engine.export_weights
        return export(_torch_dtype(dtype), int(bucket_bytes))

    @reports_phase
    def send_weights(
        self,
        transport: str,
        transport_config: Any,
        dtype: str,
        sender_rank: int | None = None,
        adapter: bool = False,
    ) -> tuple[Any, dict[str, float]]:
        """Export the full weights (or, with ``adapter``, the LoRA adapter alone) in ``dtype`` and send them
        with transport ``transport``.

        Every rank iterates the export (it may run collectives). Rank ``sender_rank`` (default: every
        rank that holds outputs) sends and returns ``(handle, stats)``; the others return ``(None, {})``.
        """
        sends = self.engine.holds_output() if sender_rank is None else self.rank == sender_rank
        config = transport_config_for(transport, transport_config)
        buckets = self._export(dtype, config.bucket_bytes, adapter)
        if not sends:
            for _ in buckets:  # join the export's collectives; this rank sends nothing
                pass
            return None, {}
        sender = self._transport(transport, config)
        handle = sender.send(buckets)
        return handle, dict(getattr(sender, "last_stats", {}))

    @reports_phase
    def sync_local_rollout(
        self, transport_config: Any, dtype: str, host_ranks: Sequence[int], adapter: bool = False
    ) -> dict[str, float]:
        """``trainer.placement=hybrid``: export the full weights in ``dtype`` and stream them straight into
        the rollout replica built in this process (ranks in ``host_ranks`` have one): no copy between
        processes, no trip through the driver, no transport. The other ranks join the export's collectives.
        Returns ``sync/bytes``, ``sync/buckets`` and ``sync/load_seconds`` (empty on ranks without a replica).
        """
        from rlcore.transports.stats import bucket_bytes

        config = transport_config_for("inprocess", transport_config)
        buckets = self._export(dtype, config.bucket_bytes, adapter)
        if self.rank not in host_ranks:
            for _ in buckets:  # join the export's collectives
                pass
            return {}
        rollout = _LOCAL_ROLLOUT.worker
        if rollout is None:
            raise RuntimeError(
                f"{self.role} rank {self.rank} should host a rollout replica (trainer.placement=hybrid), but "
                "none was built in its process"
            )
        counted = {"bytes": 0, "buckets": 0}

        def counting() -> Iterator[Any]:
            for bucket in buckets:
                counted["bytes"] += bucket_bytes(bucket)
                counted["buckets"] += 1
                yield bucket

        start = time.perf_counter()
        rollout.load_weights(counting())
        return {
            "sync/bytes": float(counted["bytes"]),
            "sync/buckets": float(counted["buckets"]),
            "sync/load_seconds": time.perf_counter() - start,
        }

    def release_sent_weights(self, transport: str, transport_config: Any) -> None:
        """Every receiver has loaded the last send: free what the transport kept for them."""
        self._transport(transport, transport_config).release_sent()

    @reports_phase
    def release(self, tags: Sequence[str]) -> None:
        self.engine.release(list(tags))
        self.platform.empty_cache()

    @reports_phase
    def resume(self, tags: Sequence[str]) -> None:
        self.engine.resume(list(tags))

    @reports_phase
    def empty_cache(self) -> None:
        """Return the device allocator's unused cached blocks (a colocated rollout is about to need them)."""
        self.platform.empty_cache()

    @reports_phase
    def save_checkpoint(self, path: str) -> None:
        self.engine.save_checkpoint(path)

    @reports_phase
    def load_checkpoint(self, path: str) -> None:
        self.engine.load_checkpoint(path)

    @reports_phase
    def export_hf(self, path: str) -> None:
        self.engine.export_hf(path)

    @reports_phase
    def memory_stats(self) -> dict[str, float]:
        return self.platform.memory_stats()

    @reports_phase
    def shutdown(self) -> None:
        """Let the engine close what it opened (process groups) before the process goes away."""
        self._close_transports()
        close = getattr(self.engine, "close", None)
        if callable(close):
            close()


class RolloutWorker(Worker):
    """Hosts one :class:`~rlcore.api.RolloutEngine` replica (which may itself span several devices).

    ``replica``/``num_replicas`` place it among its role's replicas (its rank in failure reports).
    """

    @reports_phase
    def __init__(
        self,
        engine_name: str,
        spec: RolloutSpec,
        engine_config: Any = None,
        device: str = "auto",
        replica: int = 0,
        num_replicas: int = 1,
    ):
        from rlcore.devices import get_platform
        from rlcore.plugins import registry

        self._start("rollout", replica)
        self.num_replicas = num_replicas
        self.platform = get_platform(device)
        entry = registry("rollout_engines").entry(engine_name)
        self.engine_source = engine_source(entry)
        # Before the engine class is imported: engine libraries read their environment at import.
        for key, value in self.platform.rollout_env(engine_name).items():
            os.environ.setdefault(key, value)
        engine_cls = entry.load()
        check_quantization(spec.quantization, engine_cls, entry.label)
        self.engine = engine_cls(spec, _engine_config(entry, engine_cls, engine_config), self.platform)
        _LOCAL_ROLLOUT.worker = self
        if spec.lora is not None and spec.lora_sync == "adapter" and not self.loads_adapters():
            raise ValueError(
                f"actor.lora.sync=adapter: rollout engine {entry.label} does not load LoRA adapters; set "
                "actor.lora.sync to auto or merged"
            )

    def loads_adapters(self) -> bool:
        """Whether this replica takes the LoRA adapter alone at each sync (the run trains one, with
        ``actor.lora.sync: auto``, and the engine loads adapters); else it takes merged weights."""
        loads = getattr(self.engine, "loads_adapters", None)  # engines written before the method
        return bool(loads()) if callable(loads) else False

    @reports_phase
    def topology(self) -> tuple[int, int, bool]:
        """Every replica generates for its own share of prompts and returns its results."""
        return self.rank, self.num_replicas, True

    @reports_phase
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        # With fewer prompts than replicas (a small validation set, a DAPO refill, one episode) some
        # replicas get none: they answer without asking their engine, which may refuse an empty request
        # list (SGLang: "input_ids cannot be empty").
        if not prompts:
            return []
        return self.engine.generate(prompts, params)

    @reports_phase
    def generate_with_media(
        self, requests: list[tuple[list[int], Any]], params: SamplingParams
    ) -> list[list[Completion]]:
        """:meth:`generate` of ``(prompt, media)`` pairs: prompts with their images (:mod:`rlcore.vision`)."""
        if not requests:
            return []
        prompts, media = [r[0] for r in requests], [r[1] for r in requests]
        return self.engine.generate(prompts, params, multi_modal=media)

    @reports_phase
    def run_episodes(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        agent: Any,
        tokenizer_path: str,
        multi_modal: list | None = None,
    ) -> list[list[Completion]]:
        """Multi-turn episodes with tools (:mod:`rlcore.agents`) instead of single turns: ``params.n``
        per prompt, as :meth:`generate` returns them. ``agent`` is the ``agent:`` section; the tools and
        the tokenizer (from ``tokenizer_path``) are built on the first call and kept while it is unchanged.
        ``multi_modal``: each prompt's images, sent with every model turn."""
        if not prompts:  # as in generate
            return []
        return self._agent_loop(agent, tokenizer_path).run(prompts, params, multi_modal)

    def run_episodes_with_media(
        self, requests: list[tuple[list[int], Any]], params: SamplingParams, agent: Any, tokenizer_path: str
    ) -> list[list[Completion]]:
        """:meth:`run_episodes` of ``(prompt, media)`` pairs (sharded together across replicas)."""
        if not requests:
            return []
        prompts, media = [r[0] for r in requests], [r[1] for r in requests]
        return self.run_episodes(prompts, params, agent, tokenizer_path, media)

    @reports_phase
    def run_agent_programs(
        self, tasks: list[Any], params: SamplingParams, agent: Any, tokenizer_path: str
    ) -> list[list[Completion]]:
        """Episodes of the agent program of ``agent`` (``agent.program`` or ``agent.command``) over this
        replica's chat endpoint (:mod:`rlcore.endpoint`), started on the first call and kept while the
        section is unchanged: ``params.n`` per task (:class:`~rlcore.endpoint.programs.EpisodeTask`)."""
        if not tasks:
            return []
        return self._agent_programs(agent, tokenizer_path).run(tasks, params)

    def _agent_programs(self, agent: Any, tokenizer_path: str) -> Any:
        from transformers import AutoTokenizer

        from rlcore.api import SamplingParams as Params
        from rlcore.endpoint.programs import AgentPrograms
        from rlcore.endpoint.server import ChatEndpoint

        key = (repr(agent), tokenizer_path)
        cached = getattr(self, "_programs", None)
        if cached is None or cached[0] != key:
            if cached is not None:
                cached[1].close()
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
            endpoint = ChatEndpoint(
                self.engine,
                tokenizer,
                Params(),
                host=agent.endpoint_host,
                port=agent.endpoint_port,
                honour_request_sampling=agent.honour_request_sampling,
            ).start()
            self._programs = (key, AgentPrograms(endpoint, agent, self.engine.spec.max_model_len))
        return self._programs[1]

    def _agent_loop(self, agent: Any, tokenizer_path: str) -> Any:
        from rlcore.agents.loop import build_agent_loop

        key = (repr(agent), tokenizer_path)
        cached = getattr(self, "_agent", None)
        if cached is None or cached[0] != key:
            if cached is not None:
                cached[1].close()
            self._agent = (key, build_agent_loop(self.engine, agent, tokenizer_path))
        return self._agent[1]

    def _transport(self, name: str, config: Any) -> Any:
        """As :meth:`Worker._transport`; a new transport with ``attach`` gets this worker's engine (a
        transport whose receiving end is the engine itself)."""
        new = name not in self._transports
        transport = super()._transport(name, config)
        attach = getattr(transport, "attach", None)
        if new and callable(attach):
            attach(self.engine)
        return transport

    def weight_group_ranks(self, transport: str, transport_config: Any) -> int:
        """How many ranks of a collective transport's group this replica takes: 1 (this process), or
        what the transport says for a receiver that is the engine itself (``receiver_ranks()``: SGLang's
        scheduler, one rank per tensor-parallel device)."""
        receiver = self._transport(transport, transport_config)
        ranks = getattr(receiver, "receiver_ranks", None)
        return int(ranks()) if callable(ranks) else 1

    @reports_phase
    def join_weight_group(
        self,
        transport: str,
        transport_config: Any,
        world_size: int,
        master_addr: str,
        port: int,
        first_ranks: Sequence[int] | None = None,
    ) -> None:
        """Join a collective transport's group as receiver ``first_ranks[replica]`` (default
        ``1 + replica``; the sender is rank 0). A receiver spanning several ranks takes the ones from there."""
        rank = 1 + self.rank if first_ranks is None else first_ranks[self.rank]
        self._transport(transport, transport_config).init_group(rank, world_size, master_addr, port)

    @reports_phase
    def receive_weights(self, transport: str, transport_config: Any, handle: Any) -> dict[str, float]:
        """Load the weight stream behind ``handle`` (``None`` for a collective transport, which
        receives while the sender sends); returns the transport's receive metrics. A transport with
        ``load_into(engine, handle)`` loads the engine itself (its tensors never pass through here)."""
        receiver = self._transport(transport, transport_config)
        start = time.perf_counter()
        load_into = getattr(receiver, "load_into", None)
        if callable(load_into):
            load_into(self.engine, handle)
        else:
            self.engine.load_weights(maybe_skip_weights(receiver.receive(handle)))
        stats = dict(getattr(receiver, "last_receive_stats", {}))
        stats["sync/load_seconds"] = time.perf_counter() - start
        return stats

    def load_weights(self, buckets: Iterable[Any]) -> None:
        """Load a weight stream handed over in this process (hybrid placement: the actor rank beside it)."""
        self.engine.load_weights(maybe_skip_weights(buckets))

    @reports_phase
    def release(self, tags: Sequence[str]) -> None:
        self.engine.release(list(tags))
        self.platform.empty_cache()

    @reports_phase
    def resume(self, tags: Sequence[str]) -> None:
        self.engine.resume(list(tags))

    @reports_phase
    def memory_stats(self) -> dict[str, float]:
        return self.platform.memory_stats()

    @reports_phase
    def shutdown(self) -> None:
        self._close_transports()
        for name in ("_agent", "_programs"):
            cached = getattr(self, name, None)
            if cached is not None:
                cached[1].close()
        if _LOCAL_ROLLOUT.worker is self:
            _LOCAL_ROLLOUT.worker = None
        self.engine.shutdown()


def _torch_dtype(name: str) -> Any:
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype {name!r} is not a torch dtype name (float32, bfloat16, float16)")
    return dtype


def transport_config_for(name: str, config: Any) -> Any:
    """The config object transport ``name`` is constructed with, from any config carrying its fields.

    ``config`` may be the transport's own config class, the run's ``transport:`` section, or ``None``
    (defaults). Fields are copied by name, so the run config may carry more (``check_prompts`` ...).
    """
    import attrs

    from rlcore.plugins import registry

    cls = getattr(registry("weight_transports").get(name), "config_class", None)
    if cls is None:
        return config
    if isinstance(config, cls) and getattr(config, "name", name) == name:
        return config
    known = {f.name for f in attrs.fields(cls)}
    values = {k: getattr(config, k) for k in known if config is not None and hasattr(config, k)}
    values["name"] = name
    return cls(**{k: v for k, v in values.items() if k in known})

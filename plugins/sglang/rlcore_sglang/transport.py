"""``sglang-distributed``: weights from a trainer rank straight into SGLang's scheduler, over NCCL.

For split placement (``trainer.placement=split``: the rollout on devices of its own). The ``broadcast``
transport would land every tensor in the rollout worker's process first and hand it to SGLang by CUDA
IPC handle; this one uses SGLang's own receiving side instead (``init_weights_update_group`` and
``update_weights_from_distributed``), so each tensor crosses once, from the trainer's device into every
scheduler rank's, and a tensor-parallel engine's ranks each take the whole tensor and shard it
themselves.

The group: rank 0 is the sending trainer rank; each engine adds one rank per tensor-parallel device
(:meth:`SGLangDistributedTransport.receiver_ranks`), ranks ``offset .. offset + tp_size - 1``. SGLang
builds its end with ``init_custom_process_group``: a TCP rendezvous at ``master_addr:master_port`` (the
sender hosts the store), a ``PrefixStore`` named after the group, and a process group outside
``torch.distributed``'s default one; the sender builds its end the same way (:func:`weight_group`).

Per sync, per bucket: the sender writes a header (names, dtypes, shapes) to the rendezvous store, which
each rollout worker reads and passes to its engine as one ``update_weights_from_distributed`` request
(``load_format="flattened_bucket"``); SGLang then allocates the bucket and joins the broadcast of its
bytes: every tensor's bytes back to back, in header order, as :func:`rlcore_sglang.weight_stream.pack`
lays them out. A final header ends the sync, or carries the sender's error; each engine then counts
itself done in the store, and the sender waits for all of them before it drops the sync's keys.

SGLang cannot refuse a bucket once the broadcast is under way (its ranks would leave the sender
blocked), so the stream is checked on the sender, against the model the engines serve: each receiver
publishes its layout (names, shapes, ties, dtype) when it joins. A bad tensor ends the sync there; the
tensors before it are loaded and the group stays in step for the next sync.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any

import attrs
import torch
import torch.distributed as dist
from rlcore.api import DevicePlatform, WeightBucket, WeightTransport
from rlcore.transports.config import TransportConfig
from rlcore.transports.stats import receive_stats, send_stats
from rlcore.weights import WeightLayout

from rlcore_sglang.weight_stream import ModelWeights, checked_tensors, pack

#: The name of the process group in SGLang's scheduler (its ``_model_update_group`` key) and of the
#: store prefix its NCCL rendezvous uses.
GROUP_NAME = "rlcore-weights"
#: Where headers and layouts live in the rendezvous store (apart from the group's own keys).
_HEADERS = "rlcore-sync"


class WeightSenderFailed(RuntimeError):
    """The sender's weight stream failed mid-sync; the receivers get its error text."""


@attrs.define
class SyncHandle:
    """Which sync :meth:`SGLangDistributedTransport.send` completed (receivers run while it sends)."""

    sync: int


class SGLangDistributedTransport(WeightTransport):
    """Sender on a trainer rank, receiver on each SGLang rollout worker (``attach``-ed to its engine)."""

    config_class = TransportConfig
    #: Read by ``rlcore train``'s checks: NCCL takes no two ranks of a group on one device, so the
    #: trainer and the engines need devices of their own; the receiving end is SGLang's scheduler.
    placements = ("split",)
    rollout_engines = ("sglang",)

    def __init__(self, config: TransportConfig | None = None, platform: DevicePlatform | None = None):
        self.config = config if config is not None else TransportConfig(name="sglang-distributed")
        if platform is None:
            from rlcore.devices import get_platform

            platform = get_platform("auto")
        self.platform = platform
        self.last_stats: dict[str, float] = {}
        self.last_receive_stats: dict[str, float] = {}
        self.rank: int | None = None
        self._engine: Any = None
        self._store: Any = None  # the rendezvous store (headers and layouts under _HEADERS)
        self._group: Any = None  # sender: its end of the NCCL group
        self._served: ModelWeights | None = None  # sender: what the engines accept
        self._dtype: torch.dtype | None = None
        self._sync = 0
        self._receivers = 0  # sender: how many engines load each sync

    # -- receiving end ---------------------------------------------------------------------------
    def attach(self, engine: Any) -> None:
        """Bind the rollout engine this transport loads (called in the rollout worker)."""
        missing = [m for m in ("join_weight_group", "load_weights_from_group") if not hasattr(engine, m)]
        if missing:
            raise TypeError(
                f"weight transport 'sglang-distributed' loads an SGLang engine through SGLang's own NCCL "
                f"group, but rollout engine {type(engine).__name__} has no {', '.join(missing)}; use "
                f"rollout engine sglang, or transport.name=broadcast for other engines"
            )
        self._engine = engine

    def receiver_ranks(self) -> int:
        """Ranks the attached engine takes in the group: one per tensor-parallel device."""
        return int(self._engine.spec.tensor_parallel_size)

    # -- setup -----------------------------------------------------------------------------------
    def init_group(self, rank: int, world_size: int, master_addr: str, master_port: int) -> None:
        """Rank 0 (the sender) hosts the rendezvous; a receiver (rank = its engine's first rank) has its
        engine join there and publishes what the engine serves. All call this concurrently."""
        if self.rank is not None:
            raise RuntimeError(
                f"'sglang-distributed' transport: rank {self.rank} already joined a weight group"
            )
        timeout = timedelta(seconds=self.config.timeout_s)
        if rank == 0:
            self._join_as_sender(master_addr, master_port, world_size, timeout)
        else:
            self._join_as_receiver(master_addr, master_port, rank, world_size, timeout)
        self.rank = rank

    def _join_as_sender(
        self, master_addr: str, master_port: int, world_size: int, timeout: timedelta
    ) -> None:
        backend = self.platform.dist_backend
        self._store, self._group = weight_group(backend, master_addr, master_port, 0, world_size, timeout)
        headers = self._headers()
        # Every engine has joined when the ranks they announced add up to the group's receivers.
        _wait_for(
            lambda: headers.add("receiver_ranks", 0) == world_size - 1,
            self.config.timeout_s,
            "every engine to join",
        )
        self._receivers = headers.add("receivers", 0)
        self._served, self._dtype = _served_from_json(headers.get("layout"))

    def _join_as_receiver(
        self, master_addr: str, master_port: int, rank: int, world_size: int, timeout: timedelta
    ) -> None:
        if self._engine is None:
            raise RuntimeError("'sglang-distributed' transport: attach(engine) before a receiver joins")
        self._store = dist.TCPStore(master_addr, master_port, is_master=False, timeout=timeout)
        engine = self._engine
        engine.join_weight_group(
            master_addr, master_port, rank, world_size, GROUP_NAME, self.platform.dist_backend
        )
        headers = self._headers()
        headers.set("layout", _served_to_json(engine.weights.layout, engine.dtype))
        headers.add("receivers", 1)
        headers.add("receiver_ranks", self.receiver_ranks())

    def close(self) -> None:
        """Leave the group (the sender; SGLang keeps its end until the engine shuts down)."""
        if self._group is not None:
            dist.destroy_process_group(self._group)
        self._group = self._store = None

    # -- sender ----------------------------------------------------------------------------------
    def send(self, buckets: Iterable[WeightBucket]) -> SyncHandle:
        """Check ``buckets`` against the served model, pack them into flattened buckets of
        ``transport.bucket_bytes`` and broadcast each after its header. A bad tensor (or a failing
        stream) ends the sync with an ``abort`` header after the valid tensors before it, then raises.
        Returns (or raises) once every engine is done with the sync, so the next one starts clean."""
        self._require(sender=True)
        headers, sync = self._headers(), self._sync
        start, nbytes, count = time.perf_counter(), 0, 0
        device = self.platform.current_device()
        stream = pack(
            checked_tensors(buckets, self._served, self._dtype),
            bucket_bytes=int(self.config.bucket_bytes),
            device=device,
        )
        try:
            for bucket in stream:
                headers.set(
                    f"{sync}/{count}",
                    json.dumps(
                        {
                            "kind": "bucket",
                            "names": bucket.names,
                            "dtypes": [str(s.dtype).removeprefix("torch.") for s in bucket.slots],
                            "shapes": [list(s.shape) for s in bucket.slots],
                        }
                    ),
                )
                dist.broadcast(bucket.flat, src=0, group=self._group)
                nbytes, count = nbytes + bucket.flat.numel(), count + 1
        except Exception as exc:
            headers.set(
                f"{sync}/{count}", json.dumps({"kind": "abort", "error": f"{type(exc).__name__}: {exc}"})
            )
            self._end_sync(sync, count + 1)
            raise
        headers.set(f"{sync}/{count}", json.dumps({"kind": "end"}))
        self.platform.synchronize()
        self._end_sync(sync, count + 1)
        self.last_stats = send_stats(nbytes, time.perf_counter() - start, count)
        return SyncHandle(sync)

    # -- receiver --------------------------------------------------------------------------------
    def receive(self, handle: SyncHandle | None = None) -> Iterator[WeightBucket]:
        raise RuntimeError(
            "'sglang-distributed' transport: the tensors go to SGLang's scheduler, not to this process; "
            "the rollout worker calls load_into(engine, handle)"
        )

    def load_into(self, engine: Any, handle: SyncHandle | None = None) -> None:
        """Have ``engine`` take part in the sender's current sync, bucket by bucket, as its headers
        arrive. Raises :class:`WeightSenderFailed` (after loading what came before) if the sender
        aborted the sync."""
        self._require(sender=False)
        sync = self._sync
        if handle is not None and handle.sync != sync:
            raise RuntimeError(
                f"'sglang-distributed' transport rank {self.rank}: handle of sync {handle.sync}, but this "
                f"receiver is at sync {sync}; every receiver must take part in every sync"
            )
        self._sync += 1
        counts = {"bytes": 0, "buckets": 0, "wait": 0.0}
        try:
            engine.load_weights_from_group(self._incoming(sync, counts), GROUP_NAME)
        finally:
            self._headers().add(f"done/{sync}", 1)  # the sender waits for every engine before it returns
        self.last_receive_stats = receive_stats(counts["bytes"], counts["wait"], counts["buckets"])

    def _incoming(self, sync: int, counts: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Bucket headers of sync ``sync``, as the sender writes them (waits up to ``timeout_s`` each)."""
        headers, k = self._headers(), 0
        while True:
            start = time.perf_counter()
            header = json.loads(headers.get(f"{sync}/{k}"))
            counts["wait"] += time.perf_counter() - start
            if header["kind"] == "end":
                return
            if header["kind"] == "abort":
                raise WeightSenderFailed(
                    f"'sglang-distributed' transport rank {self.rank}: the sender stopped the weight sync: "
                    f"{header['error']}"
                )
            counts["bytes"] += sum(
                torch.Size(shape).numel() * getattr(torch, dtype).itemsize
                for dtype, shape in zip(header["dtypes"], header["shapes"], strict=True)
            )
            counts["buckets"] += 1
            yield header
            k += 1

    # -- plumbing --------------------------------------------------------------------------------
    def _headers(self) -> Any:
        return dist.PrefixStore(_HEADERS, self._store)

    def _end_sync(self, sync: int, headers_written: int) -> None:
        """Wait until every engine is done with sync ``sync`` (loaded, or failed), then drop its keys."""
        headers = self._headers()
        self._sync += 1
        _wait_for(
            lambda: headers.add(f"done/{sync}", 0) == self._receivers,
            self.config.timeout_s,
            f"every engine to finish loading sync {sync}",
        )
        for k in range(headers_written):
            headers.delete_key(f"{sync}/{k}")
        headers.delete_key(f"done/{sync}")

    def _require(self, sender: bool) -> None:
        if self.rank is None:
            raise RuntimeError(
                "'sglang-distributed' transport: call init_group(rank, world_size, master_addr, master_port) "
                "on the sender and every receiver first"
            )
        if sender != (self.rank == 0):
            role = "send" if sender else "receive"
            raise RuntimeError(
                f"'sglang-distributed' transport: rank {self.rank} cannot {role}; rank 0 sends, others receive"
            )


def weight_group(
    backend: str, master_addr: str, master_port: int, rank: int, world_size: int, timeout: timedelta
) -> tuple[Any, Any]:
    """``(store, group)``: the rendezvous store and a process group of ``world_size`` ranks built as
    SGLang's ``init_custom_process_group`` builds its end (so the two meet): TCP rendezvous, the group's
    keys under ``PrefixStore(GROUP_NAME)``, ranks numbered as in the group (not the default group's)."""
    from torch.distributed.distributed_c10d import Backend, _new_process_group_helper, _world, rendezvous

    store, rank, world_size = next(
        rendezvous(f"tcp://{master_addr}:{master_port}", rank, world_size, timeout=timeout)
    )
    store.set_timeout(timeout)
    group, _ = _new_process_group_helper(
        world_size,
        rank,
        [],
        Backend(backend),
        dist.PrefixStore(GROUP_NAME, store),
        group_name=GROUP_NAME,
        timeout=timeout,
    )
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return store, group


def _served_to_json(layout: WeightLayout, dtype: torch.dtype) -> str:
    """What an engine serves (its weight layout and dtype), for the sender to check the stream against."""
    return json.dumps(
        {
            "model_path": layout.model_path,
            "shapes": {name: list(shape) for name, shape in layout.shapes.items()},
            "ties": {name: list(names) for name, names in layout.ties.items()},
            "dtype": str(dtype).removeprefix("torch."),
        }
    )


def _served_from_json(text: str | bytes) -> tuple[ModelWeights, torch.dtype]:
    served = json.loads(text)
    layout = WeightLayout(
        served["model_path"],
        {name: tuple(shape) for name, shape in served["shapes"].items()},
        {name: tuple(names) for name, names in served["ties"].items()},
    )
    return ModelWeights(layout), getattr(torch, served["dtype"])


def _wait_for(done: Any, timeout_s: float, what: str) -> None:
    """Poll ``done()`` (a store read) until true; :class:`TimeoutError` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"'sglang-distributed' transport: waited {timeout_s:.0f} s for {what} (transport.timeout_s); "
                f"did a rollout worker die? Its log says why"
            )
        time.sleep(0.001)

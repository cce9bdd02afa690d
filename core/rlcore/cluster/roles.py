"""Role handles: what an algorithm's control flow calls, whatever runs the workers.

:class:`TrainRole` (actor, critic, reference, reward model) and :class:`RolloutRole` wrap a
:class:`~rlcore.cluster.group.WorkerGroup` (local or Ray) and speak in whole batches: they split work
over data-parallel ranks or rollout replicas and join the results. :func:`sync_weights` moves the
actor's weights into every rollout engine.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

import torch

from rlcore.api import Batch, Completion, EngineSpec, LossFn, RolloutSpec, SamplingParams
from rlcore.cluster.balance import balanced_order, inverse
from rlcore.cluster.dispatch import wait_all
from rlcore.cluster.group import LocalGroup, WorkerGroup
from rlcore.cluster.placement import PoolSlot

TRAIN_STATE_TAGS = ("weights", "grads", "optimizer")
ROLLOUT_STATE_TAGS = ("weights", "kv_cache")


def _mean_metrics(results: Sequence[dict[str, float]]) -> dict[str, float]:
    """Key-wise mean of metric dicts (keys missing from some dicts average over those that have them)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for metrics in results:
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + float(value)
            counts[key] = counts.get(key, 0) + 1
    return {key: sums[key] / counts[key] for key in sums}


class TrainRole:
    """One train-engine role (``name``: ``actor``, ``critic``, ``reference`` ...) over its group.

    ``balance_batch`` (``trainer.balance_batch``): before a batch is split over data-parallel ranks,
    its rows are reordered so that every rank gets about the same number of tokens
    (``attention_mask.sum(-1)``; :mod:`rlcore.cluster.balance`), in shards of the same row counts.
    Which rows share a mini-batch does not change, and ``infer`` returns rows in the caller's order.
    """

    def __init__(self, name: str, group: WorkerGroup, *, balance_batch: bool = True):
        self.name, self.group, self.balance_batch = name, group, balance_batch

    @property
    def world_size(self) -> int:
        return self.group.world_size

    @property
    def dp_size(self) -> int:
        return self.group.dp_size

    def _shard_order(self, batch: Batch) -> list[int] | None:
        """The row order whose ``dp_size`` consecutive shards carry about equal tokens; ``None``: keep
        the batch as it is (balancing off, one rank, no ``attention_mask``, or already balanced)."""
        if not self.balance_batch or self.dp_size == 1 or "attention_mask" not in batch.tensors:
            return None
        order = balanced_order(batch["attention_mask"].sum(-1).tolist(), self.dp_size)
        return None if order == list(range(len(order))) else order

    def infer(self, batch: Batch, outputs: Sequence[str] = ("log_probs",)) -> Batch:
        """Forward only: ``outputs`` (``log_probs [B, R]``, ``entropy``, ``values``, ``scores [B]``) for
        every row of ``batch``, in the batch's order."""
        if len(batch) == 0:
            raise ValueError(f"{self.name}.infer got an empty batch")
        order = self._shard_order(batch)
        sent = batch if order is None else batch.index(order)
        result = Batch.concat(self.group.dispatch("infer", sent, tuple(outputs)))
        if len(result) != len(batch):
            raise RuntimeError(
                f"{self.name}.infer returned {len(result)} rows for a batch of {len(batch)}: an engine dropped "
                f"or duplicated rows (check its holds_output() / dp_rank_and_size())"
            )
        return result if order is None else result.index(inverse(order))

    def train(
        self,
        batch: Batch,
        loss_fn: LossFn,
        *,
        mini_batch_size: int | None = None,
        epochs: int = 1,
        shuffle_seed: int | None = None,
    ) -> dict[str, float]:
        """``epochs`` passes over ``batch`` in mini-batches of ``mini_batch_size`` sequences (``None``:
        the whole batch), one optimizer step each. Before each step the mini-batch's ``meta`` gets
        ``global_tokens`` (its ``response_mask.sum()`` over all DP ranks) and ``global_sequences`` (its
        rows), by which ``loss_fn`` normalises. ``shuffle_seed``: rows are permuted per epoch (seeded
        with ``shuffle_seed + epoch``); with ``balance_batch`` each mini-batch's rows are then reordered
        for its split over DP ranks. Returns the engine's metrics (its keys) averaged over ranks, then
        over the steps."""
        if len(batch) == 0:
            raise ValueError(f"{self.name}.train got an empty batch")
        if "response_mask" not in batch.tensors:
            raise KeyError(
                f"{self.name}.train needs batch['response_mask'] [B, R] to count the tokens losses are "
                f"normalised by; the batch has {sorted(batch.tensors)}"
            )
        size = len(batch) if mini_batch_size is None else int(mini_batch_size)
        if size < 1 or epochs < 1:
            raise ValueError(
                f"{self.name}.train: mini_batch_size and epochs must be >= 1, got {size}, {epochs}"
            )
        steps: list[dict[str, float]] = []
        for epoch in range(epochs):
            data = batch
            if shuffle_seed is not None:
                order = torch.randperm(
                    len(batch), generator=torch.Generator().manual_seed(shuffle_seed + epoch)
                )
                data = batch.index(order)
            for mini in data.split(size):
                # Balance within the mini-batch: its rows make one optimizer step whatever their order.
                order = self._shard_order(mini)
                if order is not None:
                    mini = mini.index(order)
                mini.meta["global_tokens"] = int(mini["response_mask"].sum())
                mini.meta["global_sequences"] = len(mini)
                steps.append(_mean_metrics(self.group.dispatch("train_step", mini, loss_fn)))
        return _mean_metrics(steps)

    def release(self, tags: Sequence[str] = TRAIN_STATE_TAGS) -> None:
        """Move state named by ``tags`` off the devices (colocated roles time-share them)."""
        self.group.call_all("release", tuple(tags))

    def resume(self, tags: Sequence[str] = TRAIN_STATE_TAGS) -> None:
        self.group.call_all("resume", tuple(tags))

    def empty_cache(self) -> None:
        """Hand the device allocator's cached, unused blocks back (state stays where it is)."""
        self.group.call_all("empty_cache")

    def save_checkpoint(self, path: str) -> None:
        """Every rank writes its part under directory ``path`` (the engine's layout)."""
        self.group.call_all("save_checkpoint", str(path))

    def load_checkpoint(self, path: str) -> None:
        self.group.call_all("load_checkpoint", str(path))

    def export_hf(self, path: str) -> None:
        """A Hugging Face model folder at ``path`` (written by the engine's designated rank)."""
        self.group.call_all("export_hf", str(path))

    def memory_stats(self) -> list[dict[str, float]]:
        """Device memory of each rank."""
        return self.group.call_all("memory_stats")

    def shutdown(self) -> None:
        self.group.shutdown()


class AdapterOffReference:
    """The reference policy of a LoRA run: the actor's own engine with its adapter switched off (the
    frozen base weights), so no second copy of the model is loaded. ``infer`` answers as a reference
    :class:`TrainRole` does."""

    name = "reference"

    def __init__(self, actor: TrainRole):
        self.actor = actor

    def infer(self, batch: Batch, outputs: Sequence[str] = ("log_probs",)) -> Batch:
        """``log_probs [B, R]`` of the base model (the engine's ``base_log_probs`` output)."""
        if tuple(outputs) != ("log_probs",):
            raise ValueError(f"the LoRA run's reference computes log_probs only, not {list(outputs)}")
        out = self.actor.infer(batch, ("base_log_probs",))
        return Batch({"log_probs": out["base_log_probs"]})


class RolloutRole:
    """The rollout engines: prompts are split over replicas, results kept in prompt order."""

    name = "rollout"

    def __init__(self, group: WorkerGroup):
        self.group = group
        #: transports whose collective group this role's engines joined, with the sender group
        self._joined: set[tuple[str, int]] = set()
        self._loads_adapters: bool | None = None

    @property
    def num_engines(self) -> int:
        return self.group.world_size

    def loads_adapters(self) -> bool:
        """Whether weight syncs send the LoRA adapter alone (every replica loads adapters), asked once."""
        if self._loads_adapters is None:
            self._loads_adapters = all(self.group.call_all("loads_adapters"))
        return self._loads_adapters

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        multi_modal: Sequence[Any] | None = None,
    ) -> list[list[Completion]]:
        """``result[i]`` holds ``params.n`` completions of ``prompts[i]``; ``multi_modal[i]``: its images
        (``{"image": [...]}`` or None, :mod:`rlcore.vision`), which travel with it to its replica."""
        if multi_modal is not None:
            requests = [(list(p), m) for p, m in zip(prompts, multi_modal, strict=True)]
            parts = self.group.dispatch("generate_with_media", requests, params)
        else:
            parts = self.group.dispatch("generate", [list(p) for p in prompts], params)
        out = [completions for part in parts for completions in part]
        if len(out) != len(prompts):
            raise RuntimeError(f"rollout returned {len(out)} results for {len(prompts)} prompts")
        return out

    def run_episodes(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        agent: Any,
        tokenizer_path: str,
        rows: Sequence[dict[str, Any]] | None = None,
        multi_modal: Sequence[Any] | None = None,
    ) -> list[list[Completion]]:
        """Like :meth:`generate`, but each sample is a multi-turn episode with tools (``agent``: the
        ``agent:`` section); completions carry ``response_mask`` (0 on tool tokens) and ``info``.
        ``multi_modal[i]``: prompt ``i``'s images, sent with each of its model turns.

        With an agent program (``agent.program``/``agent.command``) each episode is a run of it against
        the replica's chat endpoint, given the prompt's data row ``rows[i]`` (:mod:`rlcore.endpoint`)."""
        if getattr(agent, "uses_program", False) and multi_modal is not None:
            raise ValueError(
                "agent.program/agent.command: the chat endpoint takes text messages only, and these prompts "
                "carry images; use the built-in tool loop (agent.tools) for image prompts, or text prompts"
            )
        if getattr(agent, "uses_program", False):
            from rlcore.endpoint.programs import EpisodeTask

            if rows is None or len(rows) != len(prompts):
                raise ValueError("agent programs need each prompt's data row (rows=) beside its token ids")
            tasks = [EpisodeTask(list(p), dict(r)) for p, r in zip(prompts, rows, strict=True)]
            parts = self.group.dispatch("run_agent_programs", tasks, params, agent, tokenizer_path)
        elif multi_modal is not None:
            requests = [(list(p), m) for p, m in zip(prompts, multi_modal, strict=True)]
            parts = self.group.dispatch("run_episodes_with_media", requests, params, agent, tokenizer_path)
        else:
            parts = self.group.dispatch(
                "run_episodes", [list(p) for p in prompts], params, agent, tokenizer_path
            )
        out = [completions for part in parts for completions in part]
        if len(out) != len(prompts):
            raise RuntimeError(f"rollout returned {len(out)} episode groups for {len(prompts)} prompts")
        return out

    def release(self, tags: Sequence[str] = ROLLOUT_STATE_TAGS) -> None:
        self.group.call_all("release", tuple(tags))

    def resume(self, tags: Sequence[str] = ROLLOUT_STATE_TAGS) -> None:
        self.group.call_all("resume", tuple(tags))

    def memory_stats(self) -> list[dict[str, float]]:
        return self.group.call_all("memory_stats")

    def shutdown(self) -> None:
        self.group.shutdown()


def hosted_in(rollout: RolloutRole, actor: TrainRole) -> bool:
    """Whether the rollout replicas live in the actor ranks' processes (``trainer.placement=hybrid``)."""
    return getattr(rollout.group, "host", None) is actor.group


def resolve_transport_name(name: str, actor: TrainRole, rollout: RolloutRole, colocated: bool = False) -> str:
    """``auto``: ``inprocess`` when both roles live in one process (local backend, or the rollout hosted
    in the actor's processes); ``ipc`` when they are ``colocated`` on one node whose devices share memory
    by handle (GPUs: no trip through host memory); else ``ray``. A hosted rollout takes only
    ``inprocess``: its weights never leave the process."""
    if hosted_in(rollout, actor):
        if name not in ("auto", "inprocess"):
            raise ValueError(
                f"transport.name={name!r}, but with trainer.placement=hybrid each rollout replica lives in an "
                f"actor rank's process and loads the weights there, without a transport; set transport.name "
                f"to auto (or inprocess), or use trainer.placement=colocated to send weights with {name!r}"
            )
        return "inprocess"
    if name != "auto":
        return name
    if isinstance(actor.group, LocalGroup) and isinstance(rollout.group, LocalGroup):
        return "inprocess"
    if colocated and _one_node_sharing_device_memory(actor, rollout):
        return "ipc"
    return "ray"


def _one_node_sharing_device_memory(actor: TrainRole, rollout: RolloutRole) -> bool:
    infos = [*actor.group.ping(), *rollout.group.ping()]
    nodes = {info.get("node_id") or info.get("hostname") for info in infos}
    if len(nodes) != 1:
        return False
    return all(
        [*actor.group.call_all("ipc_handles_supported"), *rollout.group.call_all("ipc_handles_supported")]
    )


def sync_weights(actor: TrainRole, rollout: RolloutRole, transport: Any, dtype: str) -> dict[str, float]:
    """Push ``actor``'s weights (in ``dtype``) into every rollout engine through ``transport`` (a
    ``transport:`` config: ``name``, ``bucket_bytes`` ...).

    One actor rank sends (the rank holding DP rank 0's outputs; the other ranks join the export's
    collectives). A transport with a handle (``inprocess``, ``ray``) sends first, then every engine
    loads from the handle; a collective one (``broadcast``: it has ``init_group``) has the sender and
    all receivers run at once, after they joined its group on the first sync.

    Returns ``sync/seconds`` (wall time of the whole sync, driver's view), ``sync/bytes``,
    ``sync/buckets``, ``sync/send_seconds`` and the slowest engine's ``sync/receive_seconds`` and
    ``sync/load_seconds``.
    """
    from rlcore.plugins import registry

    adapter = rollout.loads_adapters()
    if hosted_in(rollout, actor):
        return _sync_hosted(actor, rollout, transport, dtype, adapter)
    name = resolve_transport_name(getattr(transport, "name", "auto") or "auto", actor, rollout)
    transport_cls = registry("weight_transports").get(name)
    sender = actor.group.output_ranks[0]
    start = time.perf_counter()
    if hasattr(transport_cls, "init_group"):
        if isinstance(actor.group, LocalGroup) or isinstance(rollout.group, LocalGroup):
            raise ValueError(
                f"weight transport {name!r} streams through a collective, so its sender and receivers must "
                f"run at the same time in different processes; with trainer.backend=local use "
                f"transport.name=inprocess"
            )
        _join_weight_group(actor, rollout, name, transport, sender)
        sent, received = wait_all(
            [
                actor.group.call_all_async("send_weights", name, transport, dtype, sender, adapter),
                rollout.group.call_all_async("receive_weights", name, transport, None),
            ]
        )
    else:
        sent = actor.group.call_all("send_weights", name, transport, dtype, sender, adapter)
        received = rollout.group.call_all("receive_weights", name, transport, sent[sender][0])
        if hasattr(transport_cls, "release_sent"):  # every engine has loaded: the sender may free its copy
            actor.group.call_rank(sender, "release_sent_weights", name, transport)
    seconds = time.perf_counter() - start
    send_stats = sent[sender][1]
    metrics = {
        "sync/seconds": seconds,
        "sync/bytes": float(send_stats.get("sync/bytes", 0.0)),
        "sync/buckets": float(send_stats.get("sync/buckets", 0.0)),
        "sync/send_seconds": float(send_stats.get("sync/seconds", 0.0)),
    }
    for key in ("sync/receive_seconds", "sync/load_seconds"):
        values = [r[key] for r in received if key in r]
        if values:
            metrics[key] = max(values)
    return metrics


def _sync_hosted(
    actor: TrainRole, rollout: RolloutRole, transport: Any, dtype: str, adapter: bool
) -> dict[str, float]:
    """Hybrid placement: every actor rank exports (collectively); the ranks hosting a replica load it in
    their own process. The metrics of :func:`sync_weights`; send time is the export, inside the load."""
    hosts = actor.group.output_ranks[: rollout.num_engines]
    start = time.perf_counter()
    results = actor.group.call_all("sync_local_rollout", transport, dtype, hosts, adapter)
    seconds = time.perf_counter() - start
    first = results[hosts[0]]
    return {
        "sync/seconds": seconds,
        "sync/bytes": first["sync/bytes"],
        "sync/buckets": first["sync/buckets"],
        "sync/load_seconds": max(results[r]["sync/load_seconds"] for r in hosts),
    }


def _join_weight_group(
    actor: TrainRole, rollout: RolloutRole, name: str, transport: Any, sender: int
) -> None:
    """First sync over a collective transport: the sender and every engine form its group."""
    key = (name, id(actor.group))
    if key in rollout._joined:
        return
    master_addr = actor.group.ping()[sender].get("node_ip") or "127.0.0.1"
    port = actor.group.call_rank(sender, "free_port")
    # Each engine takes one rank (its worker process) or, where the transport's receiving end is the
    # engine itself, one per device it spans; ranks follow the replicas in order after the sender's 0.
    spans = rollout.group.call_all("weight_group_ranks", name, transport)
    offsets = [1 + sum(spans[:replica]) for replica in range(len(spans))]
    world_size = 1 + sum(spans)
    wait_all(
        [
            actor.group.call_all_async(
                "join_weight_group", name, transport, sender, world_size, master_addr, port
            ),
            rollout.group.call_all_async(
                "join_weight_group", name, transport, world_size, master_addr, port, offsets
            ),
        ]
    )
    rollout._joined.add(key)


def make_train_role(
    name: str,
    engine_name: str,
    spec: EngineSpec,
    engine_config: Any = None,
    *,
    world_size: int = 1,
    backend: str = "ray",
    slot: PoolSlot | None = None,
    device: str = "auto",
    balance_batch: bool = True,
    **ray_options: Any,
) -> TrainRole:
    """A train role on ``backend`` (``ray``: actors in ``slot``; ``local``: in this process);
    ``balance_batch`` as in :class:`TrainRole`."""
    if backend == "local":
        group = LocalGroup.train(name, engine_name, spec, engine_config, world_size=world_size, device=device)
    elif backend == "ray":
        from rlcore.cluster.ray_group import RayGroup

        group = RayGroup.train(
            name,
            engine_name,
            spec,
            engine_config,
            world_size=world_size,
            slot=slot,
            device=device,
            **ray_options,
        )
    else:
        raise ValueError(f"trainer.backend must be 'ray' or 'local', got {backend!r}")
    # What the engine's ``auto`` settings became (rank 0 speaks for the role: its ranks share a device
    # kind), on the driver's stderr: the run's driver.log beside the config's own ``auto`` lines. A local
    # worker printed them there itself.
    if backend != "local":
        for note in group.call_rank(0, "settings_notes"):
            print(f"rlcore: {name}: {note}", file=sys.stderr, flush=True)
    return TrainRole(name, group, balance_batch=balance_batch)


def make_rollout_role(
    engine_name: str,
    spec: RolloutSpec,
    engine_config: Any = None,
    *,
    num_engines: int = 1,
    backend: str = "ray",
    slot: PoolSlot | None = None,
    device: str = "auto",
    host: TrainRole | None = None,
    **ray_options: Any,
) -> RolloutRole:
    """The rollout role on ``backend`` with ``num_engines`` replicas; ``host``: built inside that train
    role's processes (``trainer.placement=hybrid``; on the local backend every role shares the driver's
    process anyway)."""
    if backend == "local":
        return RolloutRole(
            LocalGroup.rollout(engine_name, spec, engine_config, num_engines=num_engines, device=device)
        )
    if backend != "ray":
        raise ValueError(f"trainer.backend must be 'ray' or 'local', got {backend!r}")
    from rlcore.cluster.ray_group import RayGroup

    group = RayGroup.rollout(
        engine_name,
        spec,
        engine_config,
        num_engines=num_engines,
        slot=slot,
        device=device,
        host=None if host is None else host.group,
        **ray_options,
    )
    return RolloutRole(group)

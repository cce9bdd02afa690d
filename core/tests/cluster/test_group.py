"""Worker groups: dispatch by data-parallel rank and collection from the ranks that hold results, on
both backends (in-process and Ray actors), with a worker that simulates tensor-parallel peers."""

import os
import sys

import pytest
import ray.cloudpickle
import torch
from rlcore.api import Batch, EngineSpec
from rlcore.cluster import LocalGroup, RayGroup, WorkerError, start_ray, stop_ray, wait_all
from rlcore.cluster.dispatch import Topology, shards
from rlcore.cluster.workers import Worker

# The test workers below live in this test module, which Ray workers cannot import: send them by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class PeerWorker(Worker):
    """Ranks ``tp*k .. tp*k + tp-1`` form data-parallel rank ``k`` (tensor-parallel peers); only the
    first of them holds outputs, the others return ``None``, as Megatron's TP ranks do."""

    def __init__(self, rank: int, world_size: int, tp: int = 2):
        self._start("peers", rank)
        self.tp, self.world_size, self.seen = tp, world_size, []

    def topology(self):
        return self.rank // self.tp, self.world_size // self.tp, self.rank % self.tp == 0

    def echo(self, batch: Batch, scale: int = 1):
        self.seen.append(batch["row"].tolist())
        if self.rank % self.tp:
            return None
        rows = batch["row"]
        return Batch({"row": rows, "scaled": batch["x"] * scale, "by": torch.full((len(rows),), self.rank)})

    def count(self, items: list):
        return len(items)

    def received(self):
        return self.seen

    def env(self, name: str):
        return os.environ.get(name)

    def train_engine_names(self):
        from rlcore.plugins import registry

        return registry("train_engines").names()

    def fail(self, message: str):
        raise ValueError(message)


def rows_batch(n: int) -> Batch:
    return Batch(
        {"row": torch.arange(n), "x": torch.arange(n, dtype=torch.float64)[:, None] * torch.ones(n, 3)}
    )


@pytest.fixture(scope="module")
def ray_session():
    stop_ray()
    yield start_ray(num_cpus=2)
    stop_ray()


def peer_kwargs(rank, dist):
    return {"rank": rank, "world_size": dist.world_size}


@pytest.fixture(scope="module")
def ray_peers(ray_session):
    group = RayGroup("peers", PeerWorker, peer_kwargs, 4)
    yield group
    group.shutdown()


@pytest.fixture(params=["local", "ray"])
def peers(request):
    if request.param == "local":
        return LocalGroup("peers", [PeerWorker(r, 4) for r in range(4)])
    return request.getfixturevalue("ray_peers")


@pytest.mark.parametrize("n, sizes", [(8, [4, 4]), (7, [4, 3]), (1, [1, 0])])
def test_dispatch_splits_by_dp_rank_and_collects_from_holders(peers, n, sizes):
    before = [len(s) for s in peers.call_all("received")]
    results = peers.dispatch("echo", rows_batch(n), 3)

    # One result per DP rank, from the rank holding it (ranks 0 and 2), in DP order; rows kept in order.
    assert [len(r) for r in results] == sizes
    assert [int(r["by"][0]) for r in results if len(r)] == [0, 2][: sum(1 for s in sizes if s)]
    joined = Batch.concat(results)
    assert joined["row"].tolist() == list(range(n))
    assert torch.equal(joined["scaled"], rows_batch(n)["x"] * 3)
    # TP peers got the same chunk as their holder.
    seen = [s[b:] for s, b in zip(peers.call_all("received"), before, strict=True)]
    expected = [list(range(0, sizes[0])), list(range(sizes[0], n))]
    assert seen == [[expected[0]], [expected[0]], [expected[1]], [expected[1]]]


def test_dispatch_of_a_list_and_calls_on_all_or_one_rank(peers):
    assert peers.dispatch("count", list(range(5))) == [3, 2]  # holders of DP ranks 0 and 1
    assert peers.output_ranks == [0, 2] and peers.dp_size == 2 and peers.world_size == 4
    assert [info["rank"] for info in peers.call_all("ping")] == [0, 1, 2, 3]
    assert peers.call_rank(3, "count", [1, 2]) == 2
    first, second = wait_all([peers.call_all_async("count", [1]), peers.call_all_async("count", [])])
    assert first == [1, 1, 1, 1] and second == [0, 0, 0, 0]


def test_a_failing_method_names_role_rank_and_phase(peers):
    with pytest.raises(WorkerError) as info:
        peers.call_all("fail", "bad input on purpose")
    err = info.value
    assert (err.role, err.phase) == ("peers", "fail") and err.rank in range(4)
    text = str(err)
    assert f"peers rank {err.rank} failed in fail: ValueError: bad input on purpose" in text
    assert "traceback in the worker" in text and "raise ValueError(message)" in text
    # Every rank failed the same way at once: the group is still usable.
    assert peers.dispatch("count", [1, 2, 3, 4]) == [2, 2]


def test_a_private_or_unknown_method_is_refused(peers):
    with pytest.raises(WorkerError, match="PeerWorker has no method '_start'"):
        peers.call_rank(0, "_start", "x", 0)
    with pytest.raises(WorkerError, match="has no method 'nope'"):
        peers.call_all("nope")


def test_ray_workers_run_in_their_own_processes(ray_peers):
    pids = {info["pid"] for info in ray_peers.ping()}
    assert len(pids) == 4 and os.getpid() not in pids
    info = ray_peers.ping()[0]
    assert info["node_id"] and info["placement_group"] and info["stderr_path"].endswith(".err")


def test_plugin_selection_is_forwarded_and_registries_resolve_in_the_worker(ray_session, monkeypatch):
    # The registry a Ray worker sees is built in the worker's own process, from the env it was given.
    monkeypatch.setenv("RLCORE_BLOCK_PLUGINS", "fsdp")
    group = RayGroup("peers", PeerWorker, peer_kwargs, 2)
    try:
        assert group.call_all("env", "RLCORE_BLOCK_PLUGINS") == ["fsdp", "fsdp"]
        names = group.call_rank(0, "train_engine_names")
        assert "fake" in names and "fsdp" not in names
    finally:
        group.shutdown()
    # ... so a worker asked for a blocked engine fails while building it, and says so.
    with pytest.raises(WorkerError) as info:
        RayGroup.train("actor", "fsdp", EngineSpec(model_path=""), world_size=1)
    assert info.value.phase == "__init__" and info.value.role == "actor"
    assert "unknown train engine 'fsdp'" in str(info.value)


def test_registered_plugins_load_in_workers_by_default(ray_peers):
    assert "fsdp" in ray_peers.call_rank(1, "train_engine_names")


def test_topology_checks():
    with pytest.raises(ValueError, match="disagree on the data-parallel size"):
        Topology("r", [(0, 2, True), (0, 1, True)])
    with pytest.raises(ValueError, match="no rank holds the output of data-parallel rank 1"):
        Topology("r", [(0, 2, True), (1, 2, False)])
    with pytest.raises(ValueError, match="do not fit dp_size"):
        Topology("r", [(0, 1, True), (1, 1, True)])
    assert Topology("r", [(0, 2, False), (0, 2, True), (1, 2, True), (1, 2, True)]).output_ranks == [1, 2]


def test_shards_of_lists_and_batches():
    assert shards([1, 2, 3, 4, 5], 3) == [[1, 2], [3, 4], [5]]
    assert shards([1], 2) == [[1], []]
    batch = rows_batch(5)
    batch.objects["uid"] = list("abcde")
    copies, views = shards(batch, 2), shards(batch, 2, views=True)
    for piece in (copies, views):
        assert [p["row"].tolist() for p in piece] == [[0, 1, 2], [3, 4]]
        assert [p["uid"] for p in piece] == [["a", "b", "c"], ["d", "e"]]
    assert views[1]["x"].data_ptr() == batch["x"][3].data_ptr() and views[1]["x"].is_contiguous()
    assert copies[1]["x"].data_ptr() != batch["x"][3].data_ptr()


def test_local_group_runs_one_process_per_train_role():
    with pytest.raises(ValueError, match="use trainer.backend=ray"):
        LocalGroup.train("actor", "fake", EngineSpec(model_path=""), world_size=2)

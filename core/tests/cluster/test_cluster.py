"""Joining a running Ray cluster: two nodes on this machine (the head on the default address, a second
node at 127.0.0.2), a run's placement spread over both, and data-parallel training across them."""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import ray
from rlcore.api import EngineSpec, RolloutSpec
from rlcore.cluster import (
    forwarded_env,
    make_rollout_role,
    make_train_role,
    placement_from_config,
    start_ray,
    stop_ray,
)
from rlcore.config import load_config
from rlcore.config.schema import RLConfig
from rlcore.envs import role_env_specs
from rlcore.envs.nodes import EnvironmentMissing, check_nodes
from rlcore.envs.overlay import build
from rlcore.envs.spec import HOME_ENV
from rlcore.testing.contract import contract_batch, token_nll_loss

RAY = str(Path(sys.executable).with_name("ray"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _wait_for_port(host: str, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout_s} s")


def _stop(process: subprocess.Popen, grace_s: float) -> None:
    """Stop one `ray start --block` and the Ray processes it started (its own process group only:
    `ray stop` would stop every Ray instance on the host)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    stop_ray()
    logs = tmp_path_factory.mktemp("ray-nodes")
    # Both nodes and this driver must agree on authentication. The driver's mode is fixed in-process
    # (at import, from RAY_AUTH_MODE; disabled when unset) and changing the variable later does not
    # change it, so start the nodes in whatever mode this process actually has (token mode shares the
    # token in ~/.ray/auth_token).
    from ray._private.authentication.authentication_utils import is_token_auth_enabled

    previous = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "token" if is_token_auth_enabled() else "disabled"
    env = dict(os.environ)
    port = _free_port()
    common = ["--num-cpus=1", "--disable-usage-stats", "--block"]
    nodes = []
    head_ip = ray.util.get_node_ip_address()

    # Each node has its own folder of Python environments (rlcore.envs): the head's holds what the
    # environment test builds, the second node's stays empty.
    homes = {"head": logs / "envs-head", "worker": logs / "envs-worker"}

    def start(args, name):
        log = open(logs / f"{name}.log", "w")
        homes[name].mkdir()
        nodes.append(
            subprocess.Popen(
                [RAY, "start", *args, *common],
                env={**env, HOME_ENV: str(homes[name])},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    try:
        start(["--head", f"--port={port}", "--include-dashboard=false"], "head")
        _wait_for_port(head_ip, port, 120)
        start([f"--address={head_ip}:{port}", "--node-ip-address=127.0.0.2"], "worker")
        info = start_ray(f"{head_ip}:{port}")
        deadline = time.monotonic() + 120
        while len([n for n in ray.nodes() if n["Alive"]]) < 2:
            assert time.monotonic() < deadline, f"second node did not join; see {logs}"
            time.sleep(0.5)
        yield SimpleNamespace(address=info.address, started_here=info.started_here, env_homes=homes)
    finally:
        stop_ray()
        for process, grace in zip(reversed(nodes), (20, 5), strict=False):
            _stop(process, grace)
        # `ray start --head` records its address here and only `ray stop` removes it; a stale record
        # would make every later plain `ray.init()` on this host try to join the dead head.
        record = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
        if record.is_file() and record.read_text().strip() == f"{head_ip}:{port}":
            record.unlink()
        if previous is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = previous


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_group_spreads_over_both_nodes_and_trains_across_them(two_nodes):
    assert not two_nodes.started_here
    config = RLConfig()
    config.actor.world_size, config.trainer.device = 2, "cpu"
    # Two 1-CPU bundles (the cluster's 2 CPUs): one lands on each node.
    placement = placement_from_config(config, ["actor", "rollout"])
    placement.create()
    actor = make_train_role(
        "actor",
        "fake",
        EngineSpec(model_path="", lr=0.1),
        world_size=2,
        slot=placement.slot("actor"),
        device="cpu",
    )
    rollout = make_rollout_role(
        "fake", RolloutSpec(model_path=""), slot=placement.slot("rollout"), device="cpu"
    )
    try:
        where = actor.group.ping()
        assert len({w["node_id"] for w in where}) == 2
        assert {w["node_ip"] for w in where} == {ray.util.get_node_ip_address(), "127.0.0.2"}
        assert rollout.group.ping()[0]["node_id"] == where[0]["node_id"]  # colocated with actor rank 0
        # Gradients all-reduced between the nodes: the loss falls on a batch trained repeatedly.
        batch = contract_batch(8, vocab_low=1, vocab_high=200)
        losses = [actor.train(batch, token_nll_loss)["loss"] for _ in range(3)]
        assert losses[2] < losses[0]
    finally:
        actor.shutdown()
        rollout.shutdown()
        placement.remove()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_roles_environment_missing_on_one_node_stops_the_run_before_any_worker_starts(two_nodes):
    """The rollout's environment is built on the head only: the run stops in building its roles, before
    any placement or worker exists, naming the second node and the command that builds it there."""
    config = load_config(
        overrides=[
            "environments.requirements.bare=[]",  # no pip: a venv over the driver's site-packages
            "environments.roles.rollout=bare",
            "trainer.device=cpu",
            f"trainer.ray_address={two_nodes.address}",
        ]
    )
    specs = role_env_specs(config)
    build(specs["rollout"], two_nodes.env_homes["head"], say=lambda line: None)
    with pytest.raises(EnvironmentMissing) as caught:
        check_nodes(specs)
    message = str(caught.value)
    assert (
        "role 'rollout' runs in environment 'bare' (environments.roles.rollout), which is missing" in message
    )
    assert "on node 127.0.0.2" in message and f"{HOME_ENV}={two_nodes.env_homes['worker']}" in message
    assert ray.util.get_node_ip_address() not in message  # the head has it
    assert "env build bare --config <this run's config>" in message

    from rlcore.trainer.build import build_roles

    built = []
    with pytest.raises(EnvironmentMissing, match="on node 127.0.0.2"):
        build_roles(config, ["actor"], built.append)
    assert built == []  # no placement group, no worker: stopped before step 1


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ray_address_from_the_environment_joins_the_cluster(two_nodes, monkeypatch):
    stop_ray()
    monkeypatch.setenv("RAY_ADDRESS", two_nodes.address)
    info = start_ray()
    assert not info.started_here and info.num_nodes == 2 and info.address == two_nodes.address


def test_joining_a_cluster_takes_its_size_as_it_is():
    with pytest.raises(ValueError, match="joining the running cluster at '10.0.0.1:6379' takes its size"):
        start_ray("10.0.0.1:6379", num_cpus=4)


def test_workers_get_the_drivers_plugin_selection(monkeypatch):
    monkeypatch.setenv("RLCORE_LOAD_PLUGINS", "fsdp")
    monkeypatch.setenv("RLCORE_BLOCK_PLUGINS", "vllm")
    env = forwarded_env({"EXTRA": "1"})
    assert env["RLCORE_LOAD_PLUGINS"] == "fsdp" and env["RLCORE_BLOCK_PLUGINS"] == "vllm"
    assert env["PYTHONUNBUFFERED"] == "1" and env["EXTRA"] == "1"
    assert not any(k.startswith("RAY_") for k in env)

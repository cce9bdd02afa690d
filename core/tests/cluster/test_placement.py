"""Placement: resource pools as Ray placement groups; colocated roles share devices through fractional
shares, split placement gives the rollout its own pool."""

import pytest
import ray
from rlcore.api import EngineSpec, RolloutSpec, SamplingParams
from rlcore.cluster import (
    ResourcePool,
    make_rollout_role,
    make_train_role,
    plan_placement,
    role_sizes_from_config,
    start_ray,
    stop_ray,
)
from rlcore.cluster.placement import cluster_resource
from rlcore.cluster.roles import hosted_in, resolve_transport_name, sync_weights
from rlcore.config.schema import RLConfig
from rlcore.rollout.batching import completions_to_batch
from rlcore.testing.contract import contract_batch, token_nll_loss
from rlcore.transports import TransportConfig


def test_colocated_roles_share_one_pool_in_equal_shares():
    plan = plan_placement(
        "colocated", {"actor": 2, "reference": 2, "rollout": 2}, resource="GPU", total_cpus=16
    )
    assert list(plan.pools) == ["shared"]
    pool = plan.pools["shared"]
    assert pool.num_bundles == 2 and pool.bundles() == [{"CPU": 1.0, "GPU": 1.0}] * 2
    for role in ("actor", "reference", "rollout"):
        assert plan.slot(role).pool is pool and plan.slot(role).share == pytest.approx(1 / 3)
    # What Ray is asked for: a third of the bundle's GPU and CPU, rounded down to Ray's 4 decimals.
    pool.placement_group = object()  # stands in for a created placement group
    options = pool.actor_options(1, plan.slot("actor").share)
    assert (options["num_gpus"], options["num_cpus"]) == (0.3333, 0.3333)
    assert options["scheduling_strategy"].placement_group_bundle_index == 1


def test_split_placement_gives_the_rollout_its_own_pool():
    plan = plan_placement("split", {"actor": 4, "critic": 2, "rollout": 2}, resource="GPU", total_cpus=64)
    assert {name: p.num_bundles for name, p in plan.pools.items()} == {"train": 4, "rollout": 2}
    assert plan.slot("actor").pool is plan.slot("critic").pool is plan.pools["train"]
    assert plan.slot("actor").share == 0.5 and plan.slot("rollout").share == 1.0


def test_tensor_parallel_replicas_own_consecutive_bundles():
    plan = plan_placement("split", {"actor": 2, "rollout": 6}, rollout_tensor_parallel=2, total_cpus=8)
    slot = plan.slot("rollout")
    assert slot.pool.num_bundles == 6 and [slot.bundle_of(r) for r in range(3)] == [0, 2, 4]
    assert slot.bundle_indices(1) == [2, 3]
    with pytest.raises(ValueError, match="multiple of tensor_parallel_size"):
        plan_placement("split", {"rollout": 3}, rollout_tensor_parallel=2)


def test_cpu_bundles_fit_a_small_machine():
    # 2 CPUs, 3 bundles in all: each bundle gets 0.6666 CPU, so the pools fit.
    plan = plan_placement("split", {"actor": 2, "rollout": 1}, total_cpus=2)
    assert [p.cpus_per_bundle for p in plan.pools.values()] == [0.6666, 0.6666]
    assert plan_placement("colocated", {"actor": 1}, total_cpus=64).pools["shared"].cpus_per_bundle == 1.0
    assert plan.pools["train"].bundles() == [{"CPU": 0.6666}] * 2


def test_hybrid_placement_reserves_nothing_for_the_rollout():
    # The rollout lives in the actor's processes: the pool holds the train roles only, and the rollout's
    # slot is the actor's.
    plan = plan_placement("hybrid", {"actor": 2, "reference": 2, "rollout": 2}, resource="GPU", total_cpus=16)
    assert list(plan.pools) == ["shared"] and plan.pools["shared"].num_bundles == 2
    assert plan.slot("actor").share == plan.slot("reference").share == 0.5
    assert plan.slot("rollout") is plan.slot("actor")
    with pytest.raises(ValueError, match=r"rollout.num_engines \(3\) must be at most actor.world_size \(2\)"):
        plan_placement("hybrid", {"actor": 2, "rollout": 3}, total_cpus=2)
    with pytest.raises(ValueError, match="tensor_parallel_size must be 1"):
        plan_placement("hybrid", {"actor": 2, "rollout": 2}, rollout_tensor_parallel=2, total_cpus=2)


def test_bad_plans_are_refused():
    with pytest.raises(
        ValueError, match="trainer.placement must be one of colocated, split, hybrid; got 'spread'"
    ):
        plan_placement("spread", {"actor": 1})
    with pytest.raises(ValueError, match="at least one device"):
        plan_placement("colocated", {"actor": 0})
    with pytest.raises(KeyError, match="no slot for role 'critic'"):
        plan_placement("colocated", {"actor": 1}).slot("critic")


def test_role_sizes_from_config():
    config = RLConfig()
    config.actor.world_size, config.critic.world_size = 4, 2
    config.rollout.num_engines, config.rollout.tensor_parallel_size = 3, 2
    config.teacher.world_size = 3
    sizes = role_sizes_from_config(config, ["actor", "reference", "critic", "rollout", "teacher"])
    assert sizes == {"actor": 4, "reference": 4, "critic": 2, "rollout": 6, "teacher": 3}
    with pytest.raises(ValueError, match="unknown role"):
        role_sizes_from_config(config, ["judge"])


@pytest.fixture(scope="module")
def ray_session():
    stop_ray()
    yield start_ray(num_cpus=2)
    stop_ray()


def _make_roles(plan):
    actor = make_train_role("actor", "fake", EngineSpec(model_path=""), world_size=2, slot=plan.slot("actor"))
    rollout = make_rollout_role("fake", RolloutSpec(model_path=""), num_engines=2, slot=plan.slot("rollout"))
    return actor, rollout


def test_colocated_roles_time_share_the_same_bundles(ray_session):
    # Two 1-CPU bundles hold all of this 2-CPU cluster; four workers fit only because each takes half
    # a bundle: rank r of the actor and replica r of the rollout share bundle r.
    plan = plan_placement("colocated", {"actor": 2, "rollout": 2}, total_cpus=2)
    plan.create()
    actor, rollout = _make_roles(plan)
    try:
        infos = actor.group.ping() + rollout.group.ping()
        assert {info["placement_group"] for info in infos} == {plan.pools["shared"].placement_group.id.hex()}
        assert [info["resources"] for info in infos] == [{"CPU": 0.5}] * 4
    finally:
        actor.shutdown()
        rollout.shutdown()
        plan.remove()


def test_split_roles_get_their_own_pools(ray_session):
    plan = plan_placement("split", {"actor": 2, "rollout": 2}, total_cpus=2)
    plan.create()
    actor, rollout = _make_roles(plan)
    try:
        actor_groups = {info["placement_group"] for info in actor.group.ping()}
        rollout_groups = {info["placement_group"] for info in rollout.group.ping()}
        assert actor_groups == {plan.pools["train"].placement_group.id.hex()}
        assert rollout_groups == {plan.pools["rollout"].placement_group.id.hex()}
        assert [info["resources"] for info in actor.group.ping()] == [
            {"CPU": 0.5}
        ] * 2  # whole 0.5-CPU bundles
    finally:
        actor.shutdown()
        rollout.shutdown()
        plan.remove()


def test_hybrid_replicas_live_in_the_actor_processes_and_load_weights_there(ray_session):
    plan = plan_placement("hybrid", {"actor": 2, "rollout": 2}, total_cpus=2)
    plan.create()
    spec = EngineSpec(model_path="", dtype="float64", lr=0.05)
    actor = make_train_role("actor", "fake", spec, world_size=2, slot=plan.slot("actor"))
    rollout = make_rollout_role(
        "fake", RolloutSpec(model_path="", dtype="float64"), num_engines=2, host=actor
    )
    try:
        assert hosted_in(rollout, actor)
        # Replica r runs in the process of actor rank r, which holds the whole bundle.
        assert [i["pid"] for i in rollout.group.ping()] == [i["pid"] for i in actor.group.ping()]
        assert [i["resources"] for i in actor.group.ping()] == [{"CPU": 1.0}] * 2
        assert resolve_transport_name("auto", actor, rollout) == "inprocess"
        with pytest.raises(ValueError, match="transport.name='ray', but with trainer.placement=hybrid"):
            resolve_transport_name("ray", actor, rollout)

        # Train the actor away from the rollout's (equal, seeded) initial weights.
        prompts = [[1, 2, 3], [4, 5, 6, 7]]
        params = SamplingParams(n=2, max_tokens=5, temperature=1.0, seed=0)
        probe = completions_to_batch(rollout.generate(prompts, params), pad_token_id=0)
        assert _max_gap(actor, probe) < 1e-5  # log-probs travel as float32
        actor.train(contract_batch(8, vocab_low=1, vocab_high=200), token_nll_loss)
        stale = completions_to_batch(rollout.generate(prompts, params), pad_token_id=0)
        assert _max_gap(actor, stale) > 1e-3

        metrics = sync_weights(actor, rollout, TransportConfig(name="auto"), "float64")
        assert metrics["sync/bytes"] > 0 and metrics["sync/buckets"] >= 1
        # Both replicas (each in its own actor rank's process) now sample from the trained weights.
        fresh = completions_to_batch(rollout.generate(prompts, params), pad_token_id=0)
        assert _max_gap(actor, fresh) < 1e-5
    finally:
        rollout.shutdown()
        # The hosted group stopped only its workers: the actor's processes still answer.
        assert len(actor.group.ping()) == 2
        actor.shutdown()
        plan.remove()


def _max_gap(actor, batch) -> float:
    """Largest |rollout log-prob - trainer log-prob| over the batch's response tokens."""
    trainer = actor.infer(batch, ["log_probs"])["log_probs"]
    mask = batch["response_mask"].bool()
    return float((batch["rollout_log_probs"] - trainer).abs()[mask].max())


def test_a_pool_larger_than_the_cluster_fails_at_once(ray_session):
    with pytest.raises(RuntimeError, match=r"pool 'big' needs 3 CPU .* the whole Ray cluster has 2"):
        ResourcePool("big", 3, None, 1.0).create()
    assert cluster_resource("auto") is None  # no accelerator resource in this cluster: CPU workers
    assert ray.cluster_resources()["CPU"] == 2

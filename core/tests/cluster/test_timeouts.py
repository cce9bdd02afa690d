"""A call that hangs ends within its timeout with an error naming role, engine and plugin, phase and rank,
and the group is stopped: a planted hang in an engine method (the fake rollout's generate sleeping for
minutes) and one in a weight sync's receive phase (``RLCORE_TEST_HANG``, rlcore.testing.faults)."""

import sys
import time

import pytest
import ray.cloudpickle
from rlcore.api import EngineSpec, RolloutSpec, SamplingParams
from rlcore.cluster import RayGroup, RolloutRole, TrainRole, WorkerTimeout, start_ray, stop_ray, sync_weights
from rlcore.cluster.workers import engine_source
from rlcore.plugins import registry
from rlcore.testing.fakes import FakeRolloutConfig
from rlcore.testing.faults import HANG_ENV
from rlcore.transports import TransportConfig

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

TIMEOUT_S = 3.0
#: What the bound allows beyond the timeout: the poll interval, stopping the group, reading a log tail.
MARGIN_S = 15.0


@pytest.fixture(scope="module")
def ray_session():
    stop_ray()
    yield start_ray(num_cpus=2)
    stop_ray()


def bounded(group: RayGroup) -> RayGroup:
    """``group`` with its calls bounded by the test's short timeout, once built (a worker's imports and
    engine take longer than that to start; a run bounds them by ``trainer.call_timeout_s`` too)."""
    group.call_timeout_s = TIMEOUT_S
    return group


def fake_label(kind: str) -> str:
    """``engine 'fake' from plugin 'rlcore.testing.plugin' (rlcore <version>)``."""
    return engine_source(registry(kind).entry("fake"))


@pytest.mark.timeout(120)
def test_a_hung_engine_call_fails_within_its_timeout_naming_engine_plugin_phase_and_rank(ray_session):
    config = FakeRolloutConfig(generate_cost_s=600.0)  # a generate that never comes back
    group = bounded(RayGroup.rollout("fake", RolloutSpec(model_path=""), config, device="cpu", poll_s=0.2))
    start = time.monotonic()
    with pytest.raises(WorkerTimeout) as info:
        group.call_all("generate", [[5, 6, 7]], SamplingParams(max_tokens=2))
    elapsed = time.monotonic() - start
    print(f"planted hang in generate failed after {elapsed:.2f} s (timeout {TIMEOUT_S} s)")
    assert elapsed < TIMEOUT_S + MARGIN_S
    error = info.value
    assert (error.role, error.ranks, error.phase) == ("rollout", [0], "generate")
    assert str(error).startswith(
        f"rollout rank(s) [0] ({fake_label('rollout_engines')}) did not finish generate within 3 s "
        "(trainer.call_timeout_s)"
    )
    assert "raise trainer.call_timeout_s" in str(error)
    # The stuck actor was stopped; the group stays failed with the same report, and shuts down at once.
    with pytest.raises(WorkerTimeout, match="did not finish generate"):
        group.call_all("ping")
    group.shutdown()


@pytest.mark.timeout(120)
def test_a_hung_weight_sync_phase_fails_within_its_timeout(ray_session):
    actor = TrainRole(
        "actor",
        bounded(RayGroup.train("actor", "fake", EngineSpec(model_path=""), device="cpu", poll_s=0.2)),
    )
    rollout = RolloutRole(
        bounded(
            RayGroup.rollout(
                "fake",
                RolloutSpec(model_path=""),
                device="cpu",
                poll_s=0.2,
                env_vars={HANG_ENV: "rollout:0:receive_weights:600"},
            )
        )
    )
    try:
        start = time.monotonic()
        with pytest.raises(WorkerTimeout) as info:
            sync_weights(actor, rollout, TransportConfig(name="ray"), "float32")
        elapsed = time.monotonic() - start
        print(f"planted hang in receive_weights failed after {elapsed:.2f} s (timeout {TIMEOUT_S} s)")
        # The send phase ran first under its own timeout; the receive phase's starts after it.
        assert elapsed < 2 * TIMEOUT_S + MARGIN_S
        error = info.value
        assert (error.role, error.ranks, error.phase) == ("rollout", [0], "receive_weights")
        assert f"({fake_label('rollout_engines')}) did not finish receive_weights" in str(error)
    finally:
        rollout.shutdown()
        actor.shutdown()

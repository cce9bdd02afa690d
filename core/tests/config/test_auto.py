"""``rollout.engine``, ``trainer.placement``, ``trainer.backend`` and ``rollout.dtype`` ``auto``: what they
become and the reason given."""

from __future__ import annotations

import pytest
from rlcore.config import load_config
from rlcore.config.auto import resolve_auto
from rlcore.config.schema import RLConfig
from rlcore.plugins import registry


def _load(*overrides: str) -> tuple[RLConfig, list[str]]:
    notes: list[str] = []
    return load_config(overrides=list(overrides), notes=notes), notes


@pytest.fixture(autouse=True)
def _no_cluster(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def test_on_a_cpu_auto_is_the_hf_rollout_inside_the_actor_and_says_why():
    config, notes = _load()
    assert (config.rollout.engine, config.trainer.placement) == ("hf", "hybrid")
    assert notes[0].startswith("rollout.engine auto -> hf on cpu: on CPUs the HF rollout")
    assert "0.92x against 1.44x" in notes[0]  # the measurement it rests on
    assert notes[1].startswith("trainer.placement auto -> hybrid:")


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        (("rollout.engine=vllm",), "rollout engine vllm runs in processes of its own"),
        (("rollout.tensor_parallel_size=2",), "rollout.tensor_parallel_size is not 1"),
        (("rollout.num_engines=2",), "rollout.num_engines exceeds actor.world_size"),
        (("trainer.mode=one_step_off",), "trainer.mode is one_step_off"),
        (("transport.name=ray",), "transport.name is ray"),
    ],
)
def test_auto_placement_colocates_where_hybrid_does_not_apply(overrides, reason):
    if "rollout.engine=vllm" in overrides and "vllm" not in registry("rollout_engines"):
        pytest.skip("rlcore-vllm is not installed")
    config, notes = _load(*overrides)
    assert config.trainer.placement == "colocated"
    assert notes[1] == f"trainer.placement auto -> colocated ({reason})"


def test_named_values_are_kept_and_said_to_be_as_set():
    config, notes = _load("rollout.engine=hf", "trainer.placement=colocated")
    assert (config.rollout.engine, config.trainer.placement) == ("hf", "colocated")
    assert notes[:2] == ["rollout.engine hf (as set)", "trainer.placement colocated (as set)"]
    config, notes = _load("rollout.dtype=bfloat16")
    assert config.rollout.dtype == "bfloat16" and len(notes) == 3  # no line for a value the user set


def test_on_a_cpu_a_one_process_run_runs_without_ray_and_says_why():
    config, notes = _load()
    assert config.trainer.backend == "local"
    assert notes[2].startswith("trainer.backend auto -> local: the run is one process's work on a CPU")
    assert "trainer.max_restarts" in notes[2]  # what the user gives up, and how to get it back
    # PPO's critic is a train role of one rank too: still one process.
    assert _load("algorithm.name=ppo")[0].trainer.backend == "local"


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        (
            ("trainer.placement=colocated",),
            "trainer.placement is colocated: the rollout runs in processes of its own",
        ),
        (
            ("trainer.mode=one_step_off",),
            "trainer.placement is colocated: the rollout runs in processes of its own",
        ),
        (("actor.world_size=2",), "actor.world_size is 2"),
        (("actor.world_size=2", "rollout.num_engines=2"), "actor.world_size is 2; rollout.num_engines is 2"),
        (("critic.world_size=2",), "critic.world_size is 2"),
        (("reward_model.world_size=2",), "reward_model.world_size is 2"),
        (
            ("trainer.device=fake", "rollout.engine=hf"),
            "the workers run on fake, where only Ray workers were measured",
        ),
        (("trainer.ray_address=10.0.0.1:6379", "rollout.engine=hf"), "the run joins a Ray cluster"),
    ],
)
def test_auto_backend_is_ray_where_the_run_is_more_than_one_process(overrides, reason):
    config, notes = _load(*overrides)
    assert config.trainer.backend == "ray"
    assert notes[2] == f"trainer.backend auto -> ray ({reason})"


def test_a_named_backend_is_kept():
    for backend in ("ray", "local"):
        config, notes = _load(f"trainer.backend={backend}")
        assert config.trainer.backend == backend and notes[2] == f"trainer.backend {backend} (as set)"


def test_rollout_dtype_auto_is_the_model_dtype_on_cpus():
    config, notes = _load()
    assert config.rollout.dtype == "float32"
    assert notes[3].startswith("rollout.dtype auto -> float32 (model.dtype float32): on CPUs")
    config, notes = _load("model.dtype=bfloat16")
    assert config.rollout.dtype == "bfloat16"
    assert notes[3] == "rollout.dtype auto -> bfloat16 (model.dtype)"


def test_rollout_dtype_auto_is_bf16_where_the_platform_takes_the_fast_path(monkeypatch):
    from rlcore.testing.fake_device import FakeDevicePlatform

    monkeypatch.setattr(FakeDevicePlatform, "fast_training", lambda self: (True, "a test accelerator"))
    config, notes = _load("trainer.device=fake")
    assert config.rollout.dtype == "bfloat16"
    assert notes[3] == "rollout.dtype auto -> bfloat16 (model.dtype float32): a test accelerator"


def test_joining_a_cluster_does_not_guess_its_devices_from_this_machine(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    config, notes = _load()
    expected = "vllm" if "vllm" in registry("rollout_engines") else "hf"
    assert config.rollout.engine == expected
    assert "joins a Ray cluster" in notes[0]


def test_a_device_platforms_own_choice_is_asked():
    """The choice is the platform's (``DevicePlatform.default_rollout``): the test platform keeps the
    default hook, vLLM where installed."""
    config, notes = _load("trainer.device=fake")
    expected = "vllm" if "vllm" in registry("rollout_engines") else "hf"
    assert config.rollout.engine == expected
    assert notes[0].startswith(f"rollout.engine auto -> {expected} on fake:")


def test_a_config_built_in_code_is_resolved_the_same_way():
    config, notes = resolve_auto(RLConfig())
    assert (config.rollout.engine, config.trainer.placement, config.trainer.backend) == (
        "hf",
        "hybrid",
        "local",
    )
    assert notes == _load()[1]

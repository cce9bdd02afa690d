"""The rollout contract checks values: core's HF rollout passes the whole suite, two engines with the
log-prob mistakes third-party authors make fail it with a message naming the mistake, and a run with such
an engine stops at the first weight sync under the default config, naming its plugin."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from rlcore.api import RolloutSpec
from rlcore.devices import get_platform
from rlcore.plugins import registry
from rlcore.rollout.config import HFRolloutConfig
from rlcore.rollout.hf import HFRollout
from rlcore.testing.contract import RolloutEngineContract
from rlcore.testing.fakes import FakeRollout, FakeRolloutConfig
from rlcore.testing.rollout_values import ReferenceLogits
from rlcore.testing.wrong_engines import ArgmaxHF, ArgmaxLogProbs, NoTemperatureHF, NoTemperatureLogProbs
from safetensors.torch import load_file

_spec = importlib.util.spec_from_file_location(
    "trainer_task", Path(__file__).parents[1] / "trainer" / "trainer_task.py"
)
task = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(task)


class ArgmaxFake(ArgmaxLogProbs, FakeRollout):
    pass


class NoTemperatureFake(NoTemperatureLogProbs, FakeRollout):
    pass


def build_hf(cls, tiny_model_path):
    return cls(RolloutSpec(model_path=str(tiny_model_path)), HFRolloutConfig(), get_platform("cpu"))


@pytest.fixture(scope="module")
def weights(tiny_model_path):
    return sorted(load_file(str(tiny_model_path / "model.safetensors")).items())


class TestHFRolloutContract(RolloutEngineContract):
    """Core's reference rollout, the engine every other is compared with, through the whole suite."""

    @pytest.fixture(scope="class")
    @classmethod
    def rollout_engine(cls, tiny_model_path):
        engine = build_hf(HFRollout, tiny_model_path)
        yield engine
        engine.shutdown()

    @pytest.fixture(scope="class")
    @classmethod
    def rollout_weights(cls, weights):
        return weights


@pytest.fixture(scope="module")
def reference(tiny_model_path, weights):
    return ReferenceLogits(tiny_model_path, weights)


def test_argmax_log_probs_fail_naming_the_mistake(tiny_model_path, reference):
    engine = build_hf(ArgmaxHF, tiny_model_path)
    suite = TestHFRolloutContract()
    with pytest.raises(AssertionError) as info:
        suite.test_sampled_log_probs_match_reference(engine, reference)
    message = str(info.value)
    assert "rollout log-probs at temperature 1 differ from the float64 reference log_softmax(z)" in message
    assert "most likely token at each position, not of the token that was sampled" in message
    assert "engine:" in message and "reference:" in message  # both values, side by side


def test_log_probs_ignoring_temperature_fail_naming_the_mistake(tiny_model_path, reference):
    engine = build_hf(NoTemperatureHF, tiny_model_path)
    suite = TestHFRolloutContract()
    suite.test_sampled_log_probs_match_reference(engine, reference)  # at temperature 1 it is right
    with pytest.raises(AssertionError) as info:
        suite.test_log_probs_follow_temperature(engine, reference)
    message = str(info.value)
    assert "at temperature 0.7 differ from the float64 reference log_softmax(z / 0.7)" in message
    assert "the engine ignores temperature=0.7 in its log-probs" in message


@pytest.fixture
def argmax_plugin():
    """The argmax engine registered as a third party's plugin would be."""
    rollouts = registry("rollout_engines")
    rollouts.register("argmax", ArgmaxFake, plugin="rlcore-argmax", config=FakeRolloutConfig)
    yield "argmax"
    rollouts.remove_plugin("rlcore-argmax")


def test_a_run_with_the_argmax_engine_stops_at_the_first_sync_naming_its_plugin(
    tmp_path, tiny_model_path, argmax_plugin
):
    from rlcore.trainer.run import run_training

    files = task.write_task(tmp_path / "task")
    # The defaults of transport: max_logprob_diff "auto" (0.02 for this float32 rollout).
    config = task.task_config(tmp_path, files, model__path=tiny_model_path, rollout__engine=argmax_plugin)
    assert config.transport.max_logprob_diff == "auto"
    result = run_training(config)
    assert not result.ok and result.steps == 0  # not one optimizer step on the wrong log-probs
    assert "WeightSyncMismatch" in result.error
    assert "rollout 'argmax' (plugin 'rlcore-argmax') and train engine 'fake'" in result.error
    assert "exceeds the bound 0.02 (the absolute cap of the dtype)" in result.error
    assert "the most likely token (argmax)" in result.error


def test_the_same_run_with_the_check_off_trains(tmp_path, tiny_model_path, argmax_plugin):
    # null opts out: the gap is reported, not enforced (what every run did before).
    from rlcore.trainer.loop import Trainer
    from rlcore.trainer.run import prepare_run

    files = task.write_task(tmp_path / "task")
    config = task.task_config(
        tmp_path,
        files,
        model__path=tiny_model_path,
        rollout__engine=argmax_plugin,
        transport__max_logprob_diff="null",
        trainer__total_steps=1,
    )
    config, run_dir, text = prepare_run(config)
    trainer = Trainer(config, run_dir, config_yaml=text)
    try:
        history = trainer.fit()
    finally:
        trainer.close()
    assert trainer.step == 1
    assert history[0]["sync/logprob_diff_mean"] > 0.02


@pytest.fixture
def no_temperature_plugin():
    rollouts = registry("rollout_engines")
    rollouts.register("notemp", NoTemperatureFake, plugin="rlcore-notemp", config=FakeRolloutConfig)
    yield "notemp"
    rollouts.remove_plugin("rlcore-notemp")


def _run(tmp_path, tiny_model_path, **extra):
    from rlcore.trainer.run import run_training

    files = task.write_task(tmp_path / "task")
    config = task.task_config(tmp_path, files, model__path=tiny_model_path, trainer__val_freq=0, **extra)
    return run_training(config)


def test_a_run_with_the_temperature_ignoring_engine_stops_at_the_first_sync(
    tmp_path, tiny_model_path, no_temperature_plugin
):
    result = _run(tmp_path, tiny_model_path, rollout__engine=no_temperature_plugin, rollout__temperature=0.7)
    assert not result.ok and result.steps == 0
    assert "rollout 'notemp' (plugin 'rlcore-notemp')" in result.error
    assert "exceeds the bound 0.02 (the absolute cap of the dtype)" in result.error
    assert "ignores the temperature in its log-probs" in result.error


def test_a_planted_broken_sync_stops_at_the_first_trained_sync(tmp_path, tiny_model_path, monkeypatch):
    # From the second load on (the sync after step 1), the rollout keeps the MLP block's initial weights
    # (the tiny model's one layer; on a Llama this would be "model.layers.1.").
    from rlcore.testing.faults import SKIP_WEIGHTS_ENV

    monkeypatch.setenv(SKIP_WEIGHTS_ENV, "model.mlp.:2")
    result = _run(tmp_path, tiny_model_path, trainer__total_steps=2, actor__optim__lr=0.05)
    assert not result.ok, "the initial sync passed, the first trained one must not"
    assert "training stopped at step 1 in phase 'sync_weights': WeightSyncMismatch" in result.error
    assert "rollout 'fake' (plugin 'rlcore.testing.plugin') and train engine 'fake'" in result.error
    assert "(floor " in result.error and "tokens at the initial sync)" in result.error
    assert "part of the weight stream was not applied" in result.error


def test_a_healthy_run_reports_floor_bound_and_value(tmp_path, tiny_model_path):
    result = _run(tmp_path, tiny_model_path, trainer__total_steps=2, transport__check_interval=1)
    assert result.ok, result.error
    checked = [r for r in result.history if "sync/bound" in r]
    assert len(checked) == 3  # the initial sync and both trained ones
    for r in checked:  # fp32 pair on the CPU: floor near 1e-5, bound floor + 0.005
        assert r["sync/probe_tokens"] >= 64
        assert r["sync/floor"] < 1e-3 and r["sync/logprob_diff_trimmed"] <= r["sync/bound"] <= 0.02

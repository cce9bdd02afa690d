"""The contract suites of rlcore.testing, run against the fake engines (as a plugin would run them)."""

import pytest
from rlcore.api import EngineSpec, RolloutSpec
from rlcore.testing.contract import RolloutEngineContract, TrainEngineContract
from rlcore.testing.fakes import FakeRollout, FakeRolloutConfig, FakeTrainConfig, FakeTrainEngine


class TestFakeTrainEngine(TrainEngineContract):
    heads = ("lm", "value", "score")
    vocab_high = 256
    layout_atol = 1e-5

    @pytest.fixture
    def make_train_engine(self):
        def make(**spec_overrides):
            return FakeTrainEngine(
                EngineSpec(model_path="", **spec_overrides), FakeTrainConfig(vocab_size=256)
            )

        return make


class TestFakeTrainEngineOnTinyModelFolder(TrainEngineContract):
    """Vocabulary read from a real model folder's config.json; tokenizer files carried into export_hf."""

    heads = ("lm", "value", "score")
    vocab_high = 1024

    @pytest.fixture
    def make_train_engine(self, tiny_model_path):
        def make(**spec_overrides):
            return FakeTrainEngine(
                EngineSpec(model_path=str(tiny_model_path), **spec_overrides), FakeTrainConfig()
            )

        return make


class TestFakeRollout(RolloutEngineContract):
    vocab_high = 256
    logprob_atol = 1e-6

    @pytest.fixture(scope="class")
    @classmethod
    def rollout_engine(cls):
        return FakeRollout(RolloutSpec(model_path="", seed=5), FakeRolloutConfig(vocab_size=256))

    @pytest.fixture(scope="class")
    @classmethod
    def rollout_weights(cls):
        # What the trainer of the same seed sends: its initial weights equal the rollout's.
        trainer = FakeTrainEngine(EngineSpec(model_path="", seed=5), FakeTrainConfig(vocab_size=256))
        return [
            item
            for bucket in trainer.export_weights(trainer.model.lm_head.weight.dtype, 1 << 30)
            for item in bucket
        ]

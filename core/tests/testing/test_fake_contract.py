"""The contract suites of rlcore.testing, run against the fake engines (as a plugin would run them)."""

import pytest
import torch
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


def tiny_lm_logits(weights):
    """float64 logits of TinyLM from its weights, written out from the formula in rlcore.testing.tiny_lm's
    docstring (no TinyLM code): e_t = E[x_t]; h = e_t + P e_{t-1}; h += W_down gelu(W_up h); z = W_head h."""
    w = {name: tensor.to(torch.float64) for name, tensor in weights}

    def logits(sequences):
        out = []
        for seq in sequences:
            e = w["model.embed_tokens.weight"][torch.tensor(list(seq))]
            prev = torch.cat([torch.zeros_like(e[:1]), e[:-1]])
            h = e + prev @ w["model.prev_proj.weight"].T
            h = (
                h
                + torch.nn.functional.gelu(h @ w["model.mlp.up_proj.weight"].T)
                @ w["model.mlp.down_proj.weight"].T
            )
            out.append(h @ w["lm_head.weight"].T)
        return out

    return logits


class TestFakeRollout(RolloutEngineContract):
    vocab_high = 256
    logprob_atol = 1e-6

    @pytest.fixture
    def reference_logits(self, rollout_weights):
        return tiny_lm_logits(rollout_weights)

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

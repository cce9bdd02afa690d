"""Fake engines that really compute: a train engine and a rollout over :class:`TinyLM`.

They implement the whole engine contracts with real gradients, real AdamW, real sampling and real
log-probs, on a model small enough that a controller test runs a full RL step in milliseconds. Registered
as train engine ``fake`` and rollout engine ``fake`` by :mod:`rlcore.testing.plugin`.

Given the same model fields (:class:`FakeTrainConfig` / :class:`FakeRolloutConfig`) and seed
(``EngineSpec.seed`` / ``RolloutSpec.seed``) both start from identical weights, and after
``rollout.load_weights(train.export_weights(...))`` the rollout's log-probs equal the trainer's.
With ``DistInfo.world_size > 1`` the train engine joins (or initialises) a process group and all-reduces
gradients, so data parallelism with fakes is real data parallelism.
"""

from rlcore.testing.fake_config import FakeRolloutConfig, FakeTrainConfig
from rlcore.testing.fake_rollout import FakeRollout
from rlcore.testing.fake_train import FakeTrainEngine
from rlcore.testing.tiny_lm import TinyLM

__all__ = ["FakeRollout", "FakeRolloutConfig", "FakeTrainConfig", "FakeTrainEngine", "TinyLM"]

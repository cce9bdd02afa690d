"""Registers the fake engines as train engine ``fake`` and rollout engine ``fake`` (a default plugin).

Cheap to import: the engines (torch) load only when one is built.
"""

from rlcore import hookimpl
from rlcore.testing.fake_config import FakeRolloutConfig, FakeTrainConfig


@hookimpl
def register_train_engines(register):
    register("fake", "rlcore.testing.fakes:FakeTrainEngine", config=FakeTrainConfig)


@hookimpl
def register_rollout_engines(register):
    register("fake", "rlcore.testing.fakes:FakeRollout", config=FakeRolloutConfig)

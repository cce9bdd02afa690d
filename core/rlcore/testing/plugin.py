"""Registers the fake engines as train engine ``fake`` and rollout engine ``fake``, and the CPU-backed
test device platform ``fake`` (:mod:`rlcore.testing.fake_device`), as a default plugin.

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


@hookimpl
def register_device_platforms(register):
    register("fake", "rlcore.testing.fake_device:FakeDevicePlatform")

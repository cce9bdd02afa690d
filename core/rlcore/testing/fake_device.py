"""``fake``: a device platform that is neither ``cpu`` nor ``cuda``, backed by the CPU.

Engines must run on whatever platform they are handed and ask it, never assume CUDA. Running an engine
on this platform proves that on a CPU-only machine: its name is ``fake``, its adapter hooks answer
differently from the CPU platform's (``eager`` attention, a rollout environment variable, a visible-devices
variable of its own), and it counts the calls an engine makes to it, so a test can check the engine
asked. It registers through the same ``register_device_platforms`` hook as every platform, with a
priority below ``cpu``: ``trainer.device=auto`` never picks it; ``trainer.device=fake`` does.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import ClassVar

from rlcore.api.device import DevicePlatform

#: Set by :meth:`FakeDevicePlatform.rollout_env` to the engine's name (tests read it back).
ROLLOUT_ENV = "RLCORE_FAKE_DEVICE_ROLLOUT"


class FakeDevicePlatform(DevicePlatform):
    name = "fake"
    device_type = "cpu"  # its own mapping: torch has no "fake" device; the tensors live on the CPU
    dist_backend = "gloo"
    visible_devices_env = "RLCORE_FAKE_VISIBLE_DEVICES"
    ray_resource = None  # scheduled on CPUs, so it never competes for a cluster's accelerators
    priority = -100

    #: Calls per method name, over every instance in this process.
    calls: ClassVar[collections.Counter[str]] = collections.Counter()

    @classmethod
    def is_available(cls) -> bool:
        return True

    @classmethod
    def explain(cls) -> str:
        return "test platform backed by the CPU (rlcore.testing); only chosen by name: trainer.device=fake"

    def device_count(self) -> int:
        return 1

    def set_device(self, local_rank: int):
        import torch

        self.calls["set_device"] += 1
        return torch.device(self.device_type)

    def memory_stats(self) -> dict[str, float]:
        self.calls["memory_stats"] += 1
        return {"allocated_gib": 0.0, "reserved_gib": 0.0, "total_gib": 1.0}

    def empty_cache(self) -> None:
        self.calls["empty_cache"] += 1

    def fast_training(self):
        # Its tensors live on the CPU: the CPU's plain settings, not an accelerator's compile and var-len path.
        return False, "the test platform computes on the CPU"

    def synchronize(self) -> None:
        self.calls["synchronize"] += 1

    def rollout_env(self, engine: str) -> dict[str, str]:
        self.calls["rollout_env"] += 1
        return {ROLLOUT_ENV: engine}

    def attention_implementation(self) -> str:
        # Not the "sdpa" every other platform answers, so a model loaded with "eager" shows the engine asked.
        self.calls["attention_implementation"] += 1
        return "eager"

    @classmethod
    def ray_visible_devices(cls, ids: Sequence[str]) -> dict[str, str | None]:
        return {cls.visible_devices_env: ",".join(ids)} if ids else {}

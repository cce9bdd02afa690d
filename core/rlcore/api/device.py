"""The device platform contract: every accelerator-specific fact lives behind this interface.

Nothing outside a ``DevicePlatform`` implementation branches on the vendor. Core ships ``cpu`` and
``cuda``; ``rocm`` and ``ascend`` are plugins.
"""

from __future__ import annotations

import abc
from typing import ClassVar


class DevicePlatform(abc.ABC):
    """Facts and a few operations for one kind of accelerator.

    ``priority`` orders auto-detection: the available platform with the highest priority wins.
    """

    name: ClassVar[str]  # "cpu", "cuda", "rocm", "npu"
    device_type: ClassVar[str]  # torch device type: "cpu", "cuda", "npu"
    dist_backend: ClassVar[str]  # "gloo", "nccl", "hccl"
    visible_devices_env: ClassVar[str | None] = None  # "CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES"
    ray_resource: ClassVar[str | None] = None  # "GPU", "NPU"; None: schedule on CPUs
    priority: ClassVar[int] = 0

    @classmethod
    @abc.abstractmethod
    def is_available(cls) -> bool:
        """Whether this machine has a usable device of this kind (cheap; no process-group setup)."""

    @abc.abstractmethod
    def device_count(self) -> int:
        """Devices visible to this process."""

    @abc.abstractmethod
    def set_device(self, local_rank: int):
        """Bind this process to device ``local_rank``; return the ``torch.device``."""

    @abc.abstractmethod
    def memory_stats(self) -> dict[str, float]:
        """``allocated_gib``, ``reserved_gib``, ``total_gib`` of the current device."""

    def empty_cache(self) -> None:
        """Return cached device memory to the driver. Default: nothing to do."""

    def synchronize(self) -> None:
        """Wait for queued device work. Default: nothing to wait for."""

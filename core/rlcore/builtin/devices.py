"""Built-in device platforms: ``cpu`` (always) and ``cuda`` (NVIDIA)."""

from __future__ import annotations

import os

from rlcore import hookimpl
from rlcore.api.device import DevicePlatform


class CPUPlatform(DevicePlatform):
    name = "cpu"
    device_type = "cpu"
    dist_backend = "gloo"
    priority = 0

    @classmethod
    def is_available(cls) -> bool:
        return True

    def device_count(self) -> int:
        return os.cpu_count() or 1

    def set_device(self, local_rank: int):
        import torch

        return torch.device("cpu")

    def memory_stats(self) -> dict[str, float]:
        import psutil

        vm = psutil.virtual_memory()
        rss = psutil.Process().memory_info().rss
        return {"allocated_gib": rss / 2**30, "reserved_gib": rss / 2**30, "total_gib": vm.total / 2**30}


class CUDAPlatform(DevicePlatform):
    name = "cuda"
    device_type = "cuda"
    dist_backend = "nccl"
    visible_devices_env = "CUDA_VISIBLE_DEVICES"
    ray_resource = "GPU"
    priority = 10

    @classmethod
    def is_available(cls) -> bool:
        import torch

        # ROCm builds of torch also answer torch.cuda; their platform plugin outranks this one.
        return torch.cuda.is_available() and torch.version.hip is None

    def device_count(self) -> int:
        import torch

        return torch.cuda.device_count()

    def set_device(self, local_rank: int):
        import torch

        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)

    def memory_stats(self) -> dict[str, float]:
        import torch

        free, total = torch.cuda.mem_get_info()
        return {
            "allocated_gib": torch.cuda.memory_allocated() / 2**30,
            "reserved_gib": torch.cuda.memory_reserved() / 2**30,
            "total_gib": total / 2**30,
        }

    def empty_cache(self) -> None:
        import torch

        torch.cuda.empty_cache()

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()


@hookimpl
def register_device_platforms(register):
    register("cpu", CPUPlatform)
    register("cuda", CUDAPlatform)

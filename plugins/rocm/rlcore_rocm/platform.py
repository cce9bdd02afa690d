"""``rocm``: AMD GPUs through a ROCm build of torch.

A ROCm build keeps PyTorch's CUDA names: HIP devices are ``torch.cuda`` devices of type ``cuda``, and
the ``nccl`` backend is RCCL. What differs from the built-in ``cuda`` platform, and why:

- detection: ``torch.version.hip`` is set. Both platforms see ``torch.cuda.is_available()``; the
  built-in one declines on a HIP build and this one has the higher priority, so ``auto`` picks ``rocm``.
- visible devices: ``HIP_VISIBLE_DEVICES`` (what Ray sets for its ``GPU`` resource on an AMD node), kept
  equal to ``CUDA_VISIBLE_DEVICES`` (HIP honours both; vLLM's ROCm platform raises when they differ), with
  ``ROCR_VISIBLE_DEVICES`` removed (it masks one layer lower and renumbers, so Ray's physical ids would
  index an already filtered list; Ray itself refuses it without ``HIP_VISIBLE_DEVICES``).
- memory saver: vLLM's sleep mode on ROCm works on MI300-class GPUs only (gfx942/gfx950, per vLLM's own
  platform code); SGLang's torch_memory_saver has a HIP build.

Nothing here has run on an AMD GPU (none was available); the tests exercise detection with faked torch
attributes, the Ray mapping in a real local Ray cluster, and the hook answers. See the README.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlcore.api import DevicePlatform

#: GPU generations (``gcnArchName`` prefixes) on which vLLM implements sleep mode on ROCm.
VLLM_SLEEP_ARCHS = ("gfx942", "gfx950")

#: AMD's MI300 tuning guide for vLLM and SGLang: kernel arguments in device memory cut launch latency
#: (no effect on results). Applied with setdefault, so a user's own value wins.
ROLLOUT_ENV = {"HIP_FORCE_DEV_KERNARG": "1"}


class ROCmPlatform(DevicePlatform):
    name = "rocm"
    device_type = "cuda"  # HIP devices are torch.cuda devices in a ROCm build
    dist_backend = "nccl"  # RCCL, under torch's nccl backend name
    visible_devices_env = "HIP_VISIBLE_DEVICES"
    ray_resource = "GPU"
    priority = 20  # above the built-in cuda (10): both answer torch.cuda on an AMD machine

    @classmethod
    def is_available(cls) -> bool:
        import torch

        return torch.version.hip is not None and torch.cuda.is_available()

    @classmethod
    def explain(cls) -> str:
        import torch

        if torch.version.hip is None:
            return (
                f"torch {torch.__version__} is not a ROCm build (torch.version.hip is None); install torch "
                f"from PyTorch's ROCm wheel index on an AMD GPU machine"
            )
        if not torch.cuda.is_available():
            return f"torch {torch.__version__} is a ROCm build (HIP {torch.version.hip}) but sees no AMD GPU"
        return f"{torch.cuda.device_count()} AMD GPU(s), HIP {torch.version.hip}, torch {torch.__version__}"

    def device_count(self) -> int:
        import torch

        return torch.cuda.device_count()

    def set_device(self, local_rank: int):
        import torch

        torch.cuda.set_device(local_rank)
        return torch.device(self.device_type, local_rank)

    def memory_stats(self) -> dict[str, float]:
        import torch

        # hipMemGetInfo behind mem_get_info; the caching allocator's counters are the same code as CUDA's.
        _free, total = torch.cuda.mem_get_info()
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

    # -- adapter hooks ------------------------------------------------------------------------------
    def rollout_env(self, engine: str) -> dict[str, str]:
        # AITER kernels (VLLM_ROCM_USE_AITER, SGLANG_USE_AITER) stay at the libraries' default, off: they
        # change numerics against the trainer's PyTorch kernels, which the post-sync log-prob check sees.
        return dict(ROLLOUT_ENV) if engine in ("vllm", "sglang") else {}

    def memory_saver_supported(self, engine: str) -> bool:
        if engine == "vllm":
            return self.gcn_arch().startswith(VLLM_SLEEP_ARCHS)
        return engine == "sglang"  # torch_memory_saver's HIP build (hipMemCreate/hipMemMap)

    def ipc_handles_supported(self) -> bool:
        return True  # torch's CUDA-IPC reductions run on hipIpcGetMemHandle in a ROCm build

    @classmethod
    def ray_visible_devices(cls, ids: Sequence[str]) -> dict[str, str | None]:
        if not ids:
            return {}
        joined = ",".join(ids)
        return {"HIP_VISIBLE_DEVICES": joined, "CUDA_VISIBLE_DEVICES": joined, "ROCR_VISIBLE_DEVICES": None}

    # attention_implementation: the default "sdpa" (PyTorch's ROCm SDPA runs AOTriton flash kernels).

    def gcn_arch(self) -> str:
        """The current GPU's architecture name (``"gfx942:sramecc+:xnack-"`` on an MI300X)."""
        import torch

        return str(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "gcnArchName", ""))

"""``ascend``: Huawei Ascend NPUs through torch_npu (device type ``npu``, collective backend HCCL).

torch_npu is imported when the platform is built, which a worker does right before it builds an engine
(and ``rlcore env`` on a machine that has NPUs); detection (:mod:`rlcore_ascend.detect`) never imports it.
Importing torch_npu registers the ``npu`` device type, ``torch.npu`` and the ``hccl`` process-group
backend with torch; that is all FSDP2 needs, because the FSDP engine takes its device type, backend and
device mesh from this platform. ``torch_npu.contrib.transfer_to_npu`` is not imported: it rewrites
``torch.cuda`` calls process-wide, and no rlcore engine makes any.

Nothing here has run on an Ascend NPU (none was available); see the README for what the tests cover.
"""

from __future__ import annotations

from rlcore.api import DevicePlatform

from rlcore_ascend import detect


class AscendPlatform(DevicePlatform):
    name = "ascend"
    device_type = "npu"
    dist_backend = "hccl"
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"
    ray_resource = "NPU"  # Ray's resource name for Ascend NPUs (it sets ASCEND_RT_VISIBLE_DEVICES for it)
    priority = 20

    def __init__(self) -> None:
        import torch_npu  # noqa: F401  registers torch.npu, the npu device type and the hccl backend

        from rlcore_ascend.transport import register_hccl_factory

        # The broadcast transport builds stand-alone groups through torch.distributed._dist2, which knows
        # gloo and nccl only; this adds hccl, so transport.name=broadcast works on NPUs as well.
        register_hccl_factory()

    @classmethod
    def is_available(cls) -> bool:
        return detect.npu_present()

    @classmethod
    def explain(cls) -> str:
        return detect.explain()

    def device_count(self) -> int:
        import torch

        return torch.npu.device_count()

    def set_device(self, local_rank: int):
        import torch

        torch.npu.set_device(local_rank)
        return torch.device(self.device_type, local_rank)

    def memory_stats(self) -> dict[str, float]:
        import torch

        _free, total = torch.npu.mem_get_info()
        return {
            "allocated_gib": torch.npu.memory_allocated() / 2**30,
            "reserved_gib": torch.npu.memory_reserved() / 2**30,
            "total_gib": total / 2**30,
        }

    def empty_cache(self) -> None:
        import torch

        torch.npu.empty_cache()

    def synchronize(self) -> None:
        import torch

        torch.npu.synchronize()

    # -- adapter hooks ------------------------------------------------------------------------------
    def rollout_env(self, engine: str) -> dict[str, str]:
        if engine == "vllm":
            # vllm-ascend is found by vLLM itself (its vllm.platform_plugins entry point); what it needs
            # from us is that vLLM's workers are spawned: a forked child cannot use an NPU its parent's
            # runtime already opened.
            return {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
        return {}

    def memory_saver_supported(self, engine: str) -> bool:
        # vllm-ascend implements vLLM's sleep mode over CANN's virtual memory API; the vLLM plugin still
        # asks vLLM's platform (vllm-ascend's) too. SGLang's torch_memory_saver has no NPU build.
        return engine == "vllm"

    def fast_training(self) -> tuple[bool, str]:
        # torch.compile of whole decoder layers and PyTorch's flash var-len kernel are CUDA/ROCm paths that
        # have not run on an NPU here; the engines' plain settings are the ones known to work there.
        return False, "the compiled, var-len throughput path has not been run on Ascend NPUs"

    # ipc_handles_supported: the default False: torch's device-tensor IPC reductions are CUDA's, so on
    # NPUs weights travel as bytes (hccl/broadcast, ray or inprocess transports).
    # attention_implementation: the default "sdpa", which torch_npu implements with its fused attention.
    # ray_visible_devices: the default, ASCEND_RT_VISIBLE_DEVICES=<Ray's NPU ids>, as Ray itself sets it.

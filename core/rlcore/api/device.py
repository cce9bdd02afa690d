"""The device platform contract: every accelerator-specific fact lives behind this interface.

Nothing outside a ``DevicePlatform`` implementation branches on the vendor. Core ships ``cpu`` and
``cuda``; ``rocm`` and ``ascend`` are plugins (``docs/plugins.md``, "Devices", walks through writing one).

Only ``is_available``, ``device_count``, ``set_device`` and ``memory_stats`` are abstract. Every other
hook has a default that is right for a plain device without extras, so a platform written against an
older rlcore keeps working when hooks are added (hooks only grow). The adapter hooks
(:meth:`~DevicePlatform.rollout_env`, :meth:`~DevicePlatform.memory_saver_supported`,
:meth:`~DevicePlatform.ipc_handles_supported`, :meth:`~DevicePlatform.memory_separate_from_host`,
:meth:`~DevicePlatform.attention_implementation`,
:meth:`~DevicePlatform.ray_visible_devices`) are how engine plugins learn what differs on a device:
they ask the platform and never name a vendor.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import ClassVar

import torch


class DevicePlatform(abc.ABC):
    """Facts and a few operations for one kind of accelerator.

    ``priority`` orders auto-detection: the available platform with the highest priority wins. A
    platform that refines another on the same hardware (ROCm over CUDA: both answer ``torch.cuda``)
    takes a higher priority and makes the other's ``is_available`` say no on its machines.
    """

    name: ClassVar[str]  # "cpu", "cuda", "rocm", "ascend"
    device_type: ClassVar[str]  # torch device type: "cpu", "cuda", "npu"
    dist_backend: ClassVar[str]  # "gloo", "nccl", "hccl"
    visible_devices_env: ClassVar[str | None] = None  # "CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES"
    ray_resource: ClassVar[str | None] = None  # "GPU", "NPU"; None: schedule on CPUs
    priority: ClassVar[int] = 0

    @classmethod
    @abc.abstractmethod
    def is_available(cls) -> bool:
        """Whether this machine has a usable device of this kind (cheap; no process-group setup)."""

    @classmethod
    def explain(cls) -> str:
        """One line saying why :meth:`is_available` answers as it does (``rlcore env`` shows it for every
        installed platform). Must stay as cheap as ``is_available`` and never raise; name what is
        missing and what to do ("torch is a CPU build; install a ROCm build of torch")."""
        return "available" if cls.is_available() else "not available"

    @abc.abstractmethod
    def device_count(self) -> int:
        """Devices visible to this process."""

    @abc.abstractmethod
    def set_device(self, local_rank: int):
        """Bind this process to device ``local_rank``; return the ``torch.device``."""

    @abc.abstractmethod
    def memory_stats(self) -> dict[str, float]:
        """``allocated_gib``, ``reserved_gib``, ``total_gib`` of the current device."""

    def current_device(self) -> torch.device:
        """The device this process (thread) works on now: ``torch.device("cpu")``, or ``device_type`` with
        the current index of torch's module for it (``torch.cuda.current_device()``, ``torch.npu`` ...)."""
        if self.device_type == "cpu":
            return torch.device("cpu")
        return torch.device(self.device_type, torch.get_device_module(self.device_type).current_device())

    def empty_cache(self) -> None:
        """Return cached device memory to the driver. Default: nothing to do."""

    def synchronize(self) -> None:
        """Wait for queued device work. Default: nothing to wait for."""

    # -- adapter hooks: what engines ask instead of naming a vendor -----------------------------------
    def rollout_env(self, engine: str) -> dict[str, str]:
        """Environment variables rollout engine ``engine`` (its registry name: ``"vllm"``, ``"sglang"``,
        ``"hf"`` ...) needs on this device, set before the engine is built (its library reads them at
        import). Core applies them with ``setdefault``: a variable the user set wins. Default: none."""
        return {}

    def memory_saver_supported(self, engine: str) -> bool:
        """Whether rollout engine ``engine`` can free this device's memory and take it back by tag
        (vLLM's sleep mode, SGLang's torch_memory_saver): the hardware and driver side of the question.
        An engine also asks its own library (its build may lack the feature) and frees memory only when
        both say yes; otherwise ``release`` keeps its bookkeeping and frees nothing. Default: no."""
        return False

    def ipc_handles_supported(self) -> bool:
        """Whether a tensor in this device's memory can be opened by another process on the same node
        through an IPC handle (torch.multiprocessing's device-tensor reductions: CUDA IPC, its HIP
        equivalent). Colocated weight loading by handle needs it; without it, send the bytes (the
        ``inprocess``/``ray``/``broadcast`` transports). Default: no."""
        return False

    def memory_separate_from_host(self) -> bool:
        """Whether this device has memory of its own, apart from the host's: then colocated roles make
        room for each other by moving state to the host and back by tag (``release``/``resume``). Where
        the device *is* the host (CPUs) a release would free nothing, so the trainer skips those calls
        and their round trips. Default: yes."""
        return True

    def default_rollout(self, installed: Sequence[str]) -> tuple[str, str]:
        """The rollout engine ``rollout.engine: auto`` picks on this device among the ``installed`` ones
        (registry names), and why, in a few words for the run's log. Default: vLLM when installed, else
        the reference HF rollout."""
        if "vllm" in installed:
            return "vllm", "vLLM is installed"
        return "hf", "vLLM is not installed"

    def fast_training(self) -> tuple[bool, str]:
        """Whether the ``auto`` settings of train engines and of ``rollout.dtype`` take their throughput
        path on this device (layers computing in bf16 over fp32 weights, compiled layers, packed var-len
        attention, logits kept between forward and backward where memory allows), and why, in a few words
        for the run's log. Default: yes, what an accelerator's matrix units and kernels are built for."""
        return True, "an accelerator, where bf16 compute, compiled layers and var-len attention pay off"

    def attention_implementation(self) -> str:
        """The Hugging Face ``attn_implementation`` that works on this device, used where a config leaves
        the choice open. Default ``"sdpa"``: PyTorch's own kernel, which every torch device has."""
        return "sdpa"

    @classmethod
    def ray_visible_devices(cls, ids: Sequence[str]) -> dict[str, str | None]:
        """Environment that makes exactly the devices Ray assigned to this worker visible to it, as local
        devices ``0 .. len(ids)-1``. ``ids`` are Ray's ids of ``ray_resource`` for this worker (physical
        indices on the node). ``None`` as a value unsets that variable (another layer of device masking
        that would renumber beneath the ids). Applied in every Ray worker before the platform is chosen,
        so before any device runtime starts (see :func:`rlcore.devices.ray_device_env`).

        Default: ``{visible_devices_env: "i,j"}`` when the platform has both a variable and a Ray
        resource, else nothing.
        """
        if not cls.visible_devices_env or not cls.ray_resource or not ids:
            return {}
        return {cls.visible_devices_env: ",".join(str(i) for i in ids)}

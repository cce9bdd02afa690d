"""Test-only: run megatron-core on a CPU-only machine by redirecting its unconditional CUDA calls.

megatron-core (0.16 and later) allocates buffers with ``device=torch.cuda.current_device()`` or
``device="cuda"``, calls ``.cuda()`` on tensors, and keeps its model-parallel RNG states in the CUDA
generator (FINDINGS.md). Those calls are correct on every accelerator Megatron supports, so the shipped
engine keeps them; CI has no accelerator, so this module sends them to the CPU inside the spawned
test worker processes only (never the pytest process itself: it patches ``torch.cuda`` process-wide):

* a :class:`torch.overrides.TorchFunctionMode` rewrites CUDA devices in tensor factories and
  ``Tensor.to`` / ``Tensor.cuda`` / ``Tensor.pin_memory`` to the CPU;
* ``Tensor.type()`` reports CPU tensors under their ``torch.cuda.*`` names, which Megatron's optimizers
  check for;
* ``torch.cuda.current_device`` answers 0 (which the mode maps to the CPU), and synchronisation and
  cache calls do nothing;
* Megatron's RNG tracker keeps CPU generator states instead of CUDA ones;
* CUDA streams (the MoE all-to-all dispatcher keeps a side stream for its host copies) are stand-ins
  that wait on nothing: host work runs in program order; and the dispatcher's device-to-host copies of
  its split sizes give the numpy arrays they give from a GPU (a CPU tensor is passed through as it is,
  which ``all_to_all_single`` refuses as split sizes).

Never import this from ``rlcore_megatron``: the benchmark imports it only under ``--tiny``.
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

_installed = False


def _is_cuda(device) -> bool:
    if isinstance(device, int) and not isinstance(device, bool):
        return True  # a bare index means a CUDA device to torch
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


class _CudaToCpu(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda or func is torch.Tensor.pin_memory:
            return args[0]
        if func is torch.Tensor.record_stream:
            return None
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            # Megatron's optimizers accept only "torch.cuda.*Tensor" type names.
            name = func(*args)
            return name if ".cuda." in name else name.replace("torch.", "torch.cuda.", 1)
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to:
            args = tuple("cpu" if i > 0 and _is_cuda(a) else a for i, a in enumerate(args))
        return func(*args, **kwargs)


def _cpu_get_rng_state(device="cuda", clone=False, graph_safe=False):
    return torch.get_rng_state()


def _cpu_set_rng_state(new_state, device=-1, graph_safe=False):
    torch.set_rng_state(new_state)


class _HostStream:
    """A CUDA stream's interface for host work, which runs in program order: nothing to wait for."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def wait_stream(self, other) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, event=None):
        return _HostEvent()


class _HostEvent:
    """A recorded CUDA event's interface: on the host the work before it is already done."""

    def synchronize(self) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True


_CURRENT_STREAM = _HostStream()


def install() -> None:
    """Redirect megatron-core's CUDA calls to the CPU in this process (idempotent)."""
    global _installed
    if _installed:
        return
    from megatron.core.tensor_parallel import random as mrandom

    torch.cuda.current_device = lambda: 0
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.empty_cache = lambda: None
    torch.cuda.Stream = _HostStream  # a class: transformers writes ``torch.cuda.Stream | None``
    torch.cuda.current_stream = lambda *a, **k: _CURRENT_STREAM
    torch.cuda.stream = lambda stream: contextlib.nullcontext()
    # torch.manual_seed itself calls torch.cuda.manual_seed_all: seed the CPU generator directly.
    torch.cuda.manual_seed = torch.default_generator.manual_seed
    torch.cuda.manual_seed_all = lambda seed: None
    torch.cuda.get_rng_state = _cpu_get_rng_state
    torch.cuda.set_rng_state = _cpu_set_rng_state
    mrandom._get_cuda_rng_state = _cpu_get_rng_state
    mrandom._set_cuda_rng_state = _cpu_set_rng_state
    from megatron.core.transformer.moe import token_dispatcher

    def to_host(tensor, as_numpy=False, record_stream=False):  # every such tensor is "on the device" here
        return tensor.numpy() if as_numpy and torch.is_tensor(tensor) else tensor

    token_dispatcher.maybe_move_tensor_to_cpu = to_host
    _CudaToCpu().__enter__()
    from rlcore_megatron.engine import CPU_REDIRECT_FLAG

    setattr(torch.cuda, CPU_REDIRECT_FLAG, True)  # the engine accepts a CPU device from here on
    _installed = True

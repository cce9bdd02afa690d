"""Applying FSDP2 to a :class:`rlcore_fsdp.model.HeadedModel`, in a fixed order (torchtitan style).

1. activation checkpointing of each decoder layer (Hugging Face's own, non-reentrant);
2. optionally ``torch.compile`` of each decoder layer (``fsdp.compile``), so FSDP's hooks stay outside
   the compiled code;
3. ``fully_shard`` on every decoder layer, then on the root, which thereby holds the embeddings, the
   final norm and the heads (tied input/output embeddings must live in one FSDP unit);
4. gradient reduction by plain SUM over ranks.

Why SUM: rlcore's loss functions already divide by the global token (or sequence) count of the whole
mini-batch over all data-parallel ranks, so the engine must add, not average, the ranks' gradients.
FSDP2 averages by default. ``set_gradient_divide_factor(1.0)`` alone asks for a PREMUL_SUM reduction,
which gloo rejects ("Cannot use ReduceOp.PREMUL_SUM with Gloo", torch 2.13); with
``set_force_sum_reduction_for_comms(True)`` as well FSDP2 reduces with ``ReduceOp.SUM`` and divides by
1 afterwards, i.e. not at all, on every backend (checked against a summed single-process gradient in
``tests/test_engine_distributed.py``).
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)

from rlcore_fsdp.config import FSDPConfig
from rlcore_fsdp.model import HeadedModel, decoder_layers


def parallelize(
    module: HeadedModel, mesh: DeviceMesh, config: FSDPConfig, gradient_checkpointing: bool
) -> None:
    """Shard ``module`` in place over ``mesh`` (its parameters become DTensors)."""
    if gradient_checkpointing:
        module.hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if config.mixed_precision:
        mp_policy = MixedPrecisionPolicy(
            param_dtype=getattr(torch, config.mixed_precision), reduce_dtype=torch.float32
        )
    else:
        mp_policy = MixedPrecisionPolicy()
    # Pinned host memory makes the offloaded copies asynchronous; it needs an accelerator to pin for.
    offload = (
        CPUOffloadPolicy(pin_memory=torch.accelerator.is_available())
        if config.cpu_offload
        else OffloadPolicy()
    )
    kwargs = dict(mesh=mesh, mp_policy=mp_policy, offload_policy=offload)
    for layer in decoder_layers(module.hf):
        if config.compile:
            layer.compile(dynamic=True)
        fully_shard(layer, reshard_after_forward=config.reshard_after_forward, **kwargs)
    fully_shard(module, **kwargs)
    for sub in module.modules():
        if isinstance(sub, FSDPModule):
            sub.set_gradient_divide_factor(1.0)
            # Older torch lacks the switch; there the divide factor alone makes NCCL use PREMUL_SUM(1).
            if hasattr(sub, "set_force_sum_reduction_for_comms"):
                sub.set_force_sum_reduction_for_comms(True)

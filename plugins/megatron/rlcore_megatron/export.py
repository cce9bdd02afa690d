"""The weight stream: full tensors in Hugging Face names, gathered from every Megatron shard.

Walks the pipeline stages in order; on each stage the tensor-parallel ranks all-gather their parts of
one layer at a time, convert to HF tensors, and (TP rank 0 only) send them to the last stage, whose TP
rank 0 yields them. Every rank must iterate the generator to the end: it drives the collectives.
Memory stays bounded by one layer's full tensors. With expert parallelism each layer's experts are
spread over the expert-parallel ranks: those all-gather each expert slot, so every rank of the stage
has the layer's experts in HF order.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist

from rlcore_megatron.architecture import ModelShape
from rlcore_megatron.convert import ParamMap, to_hf, unshard
from rlcore_megatron.hf_io import local_to_global
from rlcore_megatron.parallel import Layout, pp_peer, tp_all_gather


def _full(pm: ParamMap, param: torch.Tensor, layout: Layout, dtype, value=None) -> torch.Tensor:
    """The whole Megatron tensor of ``pm`` from this rank's tensor-parallel part (``value(name, param)``
    in place of the parameter where given)."""
    local = (param.detach() if value is None else value(pm.mcore, param)).to(dtype)
    if pm.tp_dim is None or layout.tp_size == 1:
        return local
    group = None
    if pm.expert is not None:
        from megatron.core import parallel_state as mpu

        group = mpu.get_expert_tensor_parallel_group()
    return unshard(pm, tp_all_gather(local, group))


def _layer_tensors(
    maps: Sequence[ParamMap],
    params: dict[str, torch.Tensor],
    shape: ModelShape,
    layout: Layout,
    dtype,
    value=None,
) -> list[tuple[str, torch.Tensor]]:
    full: dict[str, torch.Tensor] = {}
    by_name = {pm.mcore: pm for pm in maps}
    for pm in maps:
        if pm.mcore not in params:
            continue  # an expert on another expert-parallel rank: gathered with this rank's counterpart
        tensor = _full(pm, params[pm.mcore], layout, dtype, value)
        if pm.expert is None or layout.ep_size == 1:
            full[pm.mcore] = tensor
            continue
        # Every expert-parallel rank walks its own experts in the same order, so the gathers pair up:
        # rank r's slot holds global expert ``pm.expert + (r - ep_rank) * per_rank``.
        from megatron.core import parallel_state as mpu

        per_rank = shape.experts.num_experts // layout.ep_size
        parts = tp_all_gather(tensor, mpu.get_expert_model_parallel_group())
        for r, part in enumerate(parts):
            expert = pm.expert + (r - layout.ep_rank) * per_rank
            full[pm.mcore.replace(f"local_experts.{pm.expert}.", f"local_experts.{expert}.")] = part
    order = {pm.mcore: k for k, pm in enumerate(maps)}
    named = []
    for name in sorted(full, key=order.__getitem__):
        pm = by_name[name]
        named.extend((hf, t.contiguous()) for hf, t in zip(pm.hf, to_hf(pm, full[name], shape), strict=True))
    return named


def _send(named: list[tuple[str, torch.Tensor]], dst: int) -> None:
    dist.send_object_list([[(n, tuple(t.shape), t.dtype) for n, t in named]], dst=dst)
    for _, t in named:
        dist.send(t, dst=dst)


def _recv(src: int, device: torch.device) -> list[tuple[str, torch.Tensor]]:
    box: list = [None]
    dist.recv_object_list(box, src=src)
    named = []
    for name, shp, dtype in box[0]:
        t = torch.empty(shp, dtype=dtype, device=device)
        dist.recv(t, src=src)
        named.append((name, t))
    return named


def hf_named_tensors(
    model: torch.nn.Module,
    maps: Sequence[ParamMap],
    shape: ModelShape,
    layout: Layout,
    dtype: torch.dtype,
    device: torch.device,
    value=None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(hf_name, full tensor in dtype)`` for the whole model, yielded on TP rank 0 of the last stage.
    ``value(global name, param) -> tensor``: what to send for a parameter instead of itself (a LoRA
    layer's merged weight, :meth:`rlcore_megatron.lora.Adapters.merged_value`), computed one layer at a
    time."""
    offset = layout.stage_layers[layout.pp_rank][0] if layout.stage_layers[layout.pp_rank] else 0
    params = {local_to_global(n, offset, layout.expert_offset(shape)): p for n, p in model.named_parameters()}
    aliases = {pm.hf[0]: pm.aliases for pm in maps if pm.aliases}
    last = layout.pp_size - 1
    holder = layout.tp_rank == 0 and layout.is_last_stage
    for stage in range(layout.pp_size):
        owned = [pm for pm in maps if pm.export and layout.stage_of(pm.owner) == stage]
        for _, group in itertools.groupby(owned, key=lambda pm: pm.owner):
            group = list(group)
            named: list[tuple[str, torch.Tensor]] = []
            if layout.pp_rank == stage:
                named = _layer_tensors(group, params, shape, layout, dtype, value)
            if stage != last and layout.tp_rank == 0:
                if layout.pp_rank == stage:
                    _send(named, pp_peer(last))
                elif layout.is_last_stage:
                    named = _recv(pp_peer(stage), device)
            if holder:
                for name, tensor in named:
                    yield name, tensor
                    for alias in aliases.get(name, ()):
                        yield alias, tensor

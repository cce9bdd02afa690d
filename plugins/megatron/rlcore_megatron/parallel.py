"""Process groups: torch.distributed plus megatron-core's tensor/pipeline/data-parallel groups.

megatron-core keeps its groups in module-level state (``parallel_state``), so every Megatron engine in
one process shares one layout: a second engine with the same sizes reuses it, one with other sizes is an
error rather than a silent re-partition of the first.
"""

from __future__ import annotations

import datetime

import attrs
import torch
import torch.distributed as dist
from megatron.core import parallel_state as mpu
from rlcore.api import DistInfo

from rlcore_megatron.config import replica_error


@attrs.frozen
class Layout:
    """This rank's coordinates. ``stage_layers[s]``: global decoder-layer indices on pipeline stage ``s``."""

    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    dp_rank: int
    dp_size: int
    stage_layers: tuple[tuple[int, ...], ...] = ()
    #: Expert parallelism: this rank's place among the ranks one layer's experts are spread over.
    ep_rank: int = 0
    ep_size: int = 1

    def expert_offset(self, shape) -> int:
        """The global number of this rank's first expert (0 for a dense ``shape``)."""
        if shape.experts is None:
            return 0
        return self.ep_rank * (shape.experts.num_experts // self.ep_size)

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def stage_of(self, owner) -> int:
        """Pipeline stage holding a parameter owned by ``owner`` (``"first"``, ``"last"`` or a layer)."""
        if owner == "first":
            return 0
        if owner == "last":
            return self.pp_size - 1
        for stage, layers in enumerate(self.stage_layers):
            if owner in layers:
                return stage
        raise ValueError(f"decoder layer {owner} is on no pipeline stage ({self.stage_layers})")


def init_process_groups(
    dist_info: DistInfo, backend: str, tp_size: int, pp_size: int, ep_size: int = 1
) -> Layout:
    """Join (or reuse) the default process group and megatron-core's model-parallel groups."""
    if not dist.is_initialized() and dist_info.world_size == 1:
        # One rank rendezvous with nobody: an in-memory store, so two single-rank engines on one host
        # (two runs, two test workers) never race for the same TCP port.
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    elif not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{dist_info.master_addr}:{dist_info.master_port}",
            rank=dist_info.rank,
            world_size=dist_info.world_size,
            timeout=datetime.timedelta(minutes=30),
        )
    # The engine does not know its role (it runs the actor, critic or reward model alike).
    error = replica_error(
        dist.get_world_size(), tp_size, pp_size, "{actor|critic|reward_model}.world_size", ep_size
    )
    if error is not None:
        raise ValueError(error)
    if mpu.model_parallel_is_initialized():
        have = (
            mpu.get_tensor_model_parallel_world_size(),
            mpu.get_pipeline_model_parallel_world_size(),
            mpu.get_expert_model_parallel_world_size(),
        )
        if have != (tp_size, pp_size, ep_size):
            raise RuntimeError(
                f"megatron-core's process groups in this process are already set up for tp={have[0]}, "
                f"pp={have[1]}, ep={have[2]}; another Megatron engine here cannot use tp={tp_size}, "
                f"pp={pp_size}, ep={ep_size}. Give every role in one process the same megatron parallel "
                f"sizes, or separate processes."
            )
    else:
        mpu.initialize_model_parallel(
            tensor_model_parallel_size=tp_size,
            pipeline_model_parallel_size=pp_size,
            # Experts are split over the tensor-parallel ranks as the dense layers are (megatron-core's
            # default), so a rank's expert shards line up with its dense ones.
            expert_model_parallel_size=ep_size,
            expert_tensor_parallel_size=tp_size,
            # Gloo twins of every group are only needed for CPU-side optimizer collectives we do not use.
            create_gloo_process_groups=False,
        )
    return Layout(
        tp_rank=mpu.get_tensor_model_parallel_rank(),
        tp_size=tp_size,
        pp_rank=mpu.get_pipeline_model_parallel_rank(),
        pp_size=pp_size,
        dp_rank=mpu.get_data_parallel_rank(),
        dp_size=mpu.get_data_parallel_world_size(),
        ep_rank=mpu.get_expert_model_parallel_rank(),
        ep_size=ep_size,
    )


def with_stage_layers(layout: Layout, local_layers: list[int]) -> Layout:
    """``layout`` plus every stage's global layer indices, gathered over the pipeline group."""
    gathered: list = [None] * layout.pp_size
    if layout.pp_size > 1:
        dist.all_gather_object(gathered, list(local_layers), group=mpu.get_pipeline_model_parallel_group())
    else:
        gathered = [list(local_layers)]
    return attrs.evolve(layout, stage_layers=tuple(tuple(x) for x in gathered))


def pp_peer(stage: int) -> int:
    """Global rank of pipeline stage ``stage`` in this rank's pipeline group."""
    return dist.get_process_group_ranks(mpu.get_pipeline_model_parallel_group())[stage]


def broadcast_from_last_stage(obj, layout: Layout):
    """``obj`` as held by the last pipeline stage, on every stage (small Python objects)."""
    if layout.pp_size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(
        box, src=pp_peer(layout.pp_size - 1), group=mpu.get_pipeline_model_parallel_group()
    )
    return box[0]


def gather_over_dp(obj, layout: Layout) -> list:
    """``obj`` from every data-parallel rank, in DP order."""
    if layout.dp_size == 1:
        return [obj]
    out: list = [None] * layout.dp_size
    dist.all_gather_object(out, obj, group=mpu.get_data_parallel_group())
    return out


def tp_all_gather(t: torch.Tensor, group=None) -> list[torch.Tensor]:
    """Every tensor-parallel rank's ``t`` (same shape on each), in rank order; ``group``: another group
    to gather over (the expert-parallel one)."""
    group = group if group is not None else mpu.get_tensor_model_parallel_group()
    out = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, t.contiguous(), group=group)
    return out

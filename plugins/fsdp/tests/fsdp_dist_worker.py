"""One rank of the 2-process gloo run in ``test_engine_distributed.py`` (started with torch.multiprocessing).

Each rank trains every variant on its data-parallel shard of :func:`fsdp_support.batch` (``meta`` keeps
the whole batch's token count) and saves what it saw to ``OUT/rank{r}.pt``; rank 0 also saves the full
weights.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from fsdp_support import STEPS, VARIANTS, batch, full_weights, nll_entropy_loss, spec
from rlcore.api import DistInfo
from rlcore.devices import get_platform
from rlcore_fsdp.config import FSDPConfig
from rlcore_fsdp.engine import FSDPEngine


def run(rank: int, world: int, port: int, model_path: str, out: str) -> None:
    torch.set_num_threads(1)
    info = DistInfo(rank=rank, world_size=world, local_rank=rank, master_port=port)
    platform = get_platform("cpu")
    shard = batch().chunk(world)[rank]
    saved: dict = {"rows": len(shard)}
    engines = []

    for name, (config, overrides) in VARIANTS.items():
        engine = FSDPEngine(spec(model_path, **overrides), FSDPConfig(**config), platform, info)
        engines.append(engine)
        metrics = [engine.train_step(shard, nll_entropy_loss) for _ in range(STEPS)]
        saved[name] = {"metrics": metrics, "infer": engine.infer(shard, ["log_probs", "entropy"]).tensors}
        weights = full_weights(engine)  # every rank takes part in the gathers
        if rank == 0:
            saved[name]["weights"] = weights

    # Checkpoint round trip: 2 steps, save, 1 more; a fresh engine loads and takes the same last step.
    first = FSDPEngine(spec(model_path), FSDPConfig(), platform, info)
    for _ in range(2):
        first.train_step(shard, nll_entropy_loss)
    first.save_checkpoint(f"{out}/ckpt")
    first.train_step(shard, nll_entropy_loss)
    second = FSDPEngine(spec(model_path), FSDPConfig(), platform, info)
    second.load_checkpoint(f"{out}/ckpt")
    second.train_step(shard, nll_entropy_loss)
    continued, resumed = full_weights(first), full_weights(second)
    saved["resume_step"] = second.step
    if rank == 0:
        saved["continued"], saved["resumed"] = continued, resumed
    second.export_hf(f"{out}/hf")
    saved["hf_infer"] = second.infer(shard, ["log_probs"]).tensors

    # The first engine created the process group; closing it (and only it) tears the group down.
    second.close()
    saved["closed_by_non_owner"] = not dist.is_initialized()
    engines[0].close()
    saved["closed"] = not dist.is_initialized()
    torch.save(saved, f"{out}/rank{rank}.pt")

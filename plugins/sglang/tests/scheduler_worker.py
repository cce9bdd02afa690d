"""One SGLang rollout worker of the ``sglang-distributed`` transport test, run as its own process:
``python scheduler_worker.py RANK WORLD_SIZE PORT OUT.pt``.

The real plugin code runs here (``SGLangDistributedTransport`` attached to an ``SGLangRollout``, its
engine loop and weight-load bookkeeping); only ``sglang.Engine`` is a stand-in, whose tokenizer manager
does what SGLang 0.5.16's scheduler does with the two requests (``weight_updater.py``): join the group
as ``init_custom_process_group`` does, and per bucket allocate the tensors, broadcast into their
concatenated bytes and load the reconstructed tensors. It follows the sender's script of syncs in
``test_distributed_transport.py`` and saves what the model held after each.
"""

import dataclasses
import sys
import types
from datetime import timedelta
from types import SimpleNamespace

import torch
import torch.distributed as dist


def install_io_struct() -> None:
    """``sglang.srt.managers.io_struct``'s two request types, with SGLang 0.5.16's fields."""

    @dataclasses.dataclass(kw_only=True)
    class InitWeightsUpdateGroupReqInput:
        master_address: str
        master_port: int
        rank_offset: int
        world_size: int
        group_name: str = "weight_update_group"
        backend: str = "nccl"

    @dataclasses.dataclass(kw_only=True)
    class UpdateWeightsFromDistributedReqInput:
        names: list
        dtypes: list
        shapes: list
        group_name: str = "weight_update_group"
        flush_cache: bool = True
        abort_all_requests: bool = False
        weight_version: str | None = None
        load_format: str | None = None
        torch_empty_cache: bool = False

    module = types.ModuleType("sglang.srt.managers.io_struct")
    module.InitWeightsUpdateGroupReqInput = InitWeightsUpdateGroupReqInput
    module.UpdateWeightsFromDistributedReqInput = UpdateWeightsFromDistributedReqInput
    for name in ("sglang", "sglang.srt", "sglang.srt.managers"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["sglang.srt.managers.io_struct"] = module


class SchedulerStandIn:
    """The tokenizer manager's weight calls, answered as SGLang's scheduler (one TP rank) answers them."""

    def __init__(self):
        self.groups: dict = {}
        self.params: dict[str, torch.Tensor] = {}
        self.requests: list = []
        self.flushes = 0

    async def init_weights_update_group(self, obj, request):
        from torch.distributed.distributed_c10d import Backend, _new_process_group_helper, _world, rendezvous

        timeout = timedelta(seconds=120)
        store, rank, world_size = next(
            rendezvous(
                f"tcp://{obj.master_address}:{obj.master_port}",
                obj.rank_offset,
                obj.world_size,
                timeout=timeout,
            )
        )
        store.set_timeout(timeout)
        group, _ = _new_process_group_helper(
            world_size,
            rank,
            [],
            Backend(obj.backend),
            dist.PrefixStore(obj.group_name, store),
            group_name=obj.group_name,
            timeout=timeout,
        )
        _world.pg_group_ranks[group] = {i: i for i in range(world_size)}
        self.groups[obj.group_name] = group
        return True, "Succeeded to initialize custom process group."

    async def update_weights_from_distributed(self, obj, request):
        assert obj.load_format == "flattened_bucket" and obj.flush_cache is False
        named = [
            (name, torch.empty(shape, dtype=getattr(torch, dtype)))
            for name, dtype, shape in zip(obj.names, obj.dtypes, obj.shapes, strict=True)
        ]
        flat = torch.cat([tensor.flatten().view(torch.uint8) for _, tensor in named])
        dist.broadcast(flat, src=0, group=self.groups[obj.group_name])
        start = 0
        for name, tensor in named:
            size = tensor.numel() * tensor.element_size()
            self.params[name] = flat[start : start + size].view(tensor.dtype).reshape(tensor.shape).clone()
            start += size
        self.requests.append(obj)
        return True, "Succeeded to update parameter online."

    async def flush_cache(self):
        self.flushes += 1
        return SimpleNamespace(success=True)


def build_engine():
    import dist_stream
    from rlcore_sglang.config import SGLangConfig
    from rlcore_sglang.engine import SGLangRollout
    from rlcore_sglang.engine_loop import EngineLoop
    from rlcore_sglang.memory import MemoryTags
    from rlcore_sglang.weight_stream import ModelWeights

    engine = SGLangRollout.__new__(SGLangRollout)  # everything but sglang.Engine is the plugin's
    engine.spec = SimpleNamespace(tensor_parallel_size=1)
    engine.config = SGLangConfig()
    engine.memory = MemoryTags(memory_saver=False, weights_backup=False, cuda_graph=False)
    engine.weights = ModelWeights(dist_stream.LAYOUT)
    engine.dtype = torch.float32
    engine._loop = EngineLoop(lambda: SimpleNamespace(tokenizer_manager=SchedulerStandIn()))
    return engine


def main(rank: int, world_size: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    install_io_struct()
    from rlcore.devices import get_platform
    from rlcore.transports.config import TransportConfig
    from rlcore_sglang.transport import SGLangDistributedTransport

    engine = build_engine()
    scheduler = engine._loop.engine.tokenizer_manager
    transport = SGLangDistributedTransport(
        TransportConfig(name="sglang-distributed", timeout_s=120), get_platform("cpu")
    )
    transport.attach(engine)
    transport.init_group(rank, world_size, "127.0.0.1", port)
    seen = {"ranks": transport.receiver_ranks(), "syncs": []}
    for _ in range(3):  # a whole stream, one with a bad name, a whole one again
        error = None
        try:
            transport.load_into(engine, None)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        seen["syncs"].append(
            {
                "params": {name: value.clone() for name, value in scheduler.params.items()},
                "error": error,
                "flushes": scheduler.flushes,
                "requests": len(scheduler.requests),
                "stats": dict(transport.last_receive_stats),
            }
        )
    torch.save(seen, out)
    engine._loop.close()


if __name__ == "__main__":
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])

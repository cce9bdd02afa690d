"""``hccl``: the weight broadcast of split placement (trainer rank 0 to every rollout engine) over HCCL.

It is core's ``broadcast`` transport (:mod:`rlcore.transports.broadcast`: the same header protocol,
64-byte aligned flat buckets, abort and drain), pinned to HCCL: it refuses a platform whose collective
backend is not ``hccl`` (so a CPU or GPU run that names it fails at once, naming the transport to use
instead), and it makes sure torch.distributed's stand-alone group factory for ``hccl`` exists. Core's
broadcast builds its group through ``torch.distributed._dist2``, which ships gloo and nccl factories
only; :func:`register_hccl_factory` adds one over torch_npu's ``ProcessGroupHCCL``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from rlcore.api import DevicePlatform
from rlcore.transports.broadcast import BroadcastTransport
from rlcore.transports.config import TransportConfig

BACKEND = "hccl"


class HCCLTransport(BroadcastTransport):
    config_class = TransportConfig

    def __init__(self, config: TransportConfig | None = None, platform: DevicePlatform | None = None):
        super().__init__(config if config is not None else TransportConfig(name="hccl"), platform)
        if self.platform.dist_backend != BACKEND:
            raise ValueError(
                f"transport.name=hccl (rlcore-ascend) broadcasts over HCCL, but the device platform "
                f"{self.platform.name!r} uses {self.platform.dist_backend!r}; set trainer.device=ascend on "
                f"an Ascend machine, or transport.name=broadcast (any platform's backend) or ray"
            )

    def init_group(self, rank: int, world_size: int, master_addr: str, master_port: int) -> None:
        register_hccl_factory()
        super().init_group(rank, world_size, master_addr, master_port)


def register_hccl_factory() -> None:
    """Register :func:`hccl_group_factory` with ``torch.distributed._dist2`` unless a factory for
    ``hccl`` is already there (a newer torch_npu may ship its own). Idempotent."""
    from torch.distributed import _dist2

    if BACKEND not in _dist2._BACKENDS:
        _dist2.register_backend(BACKEND, hccl_group_factory)


def hccl_group_factory(
    store: Any, rank: int, world_size: int, timeout: timedelta, device: Any, **options: Any
) -> Any:
    """A stand-alone ``ProcessGroup`` of ``world_size`` ranks over HCCL on ``device`` (an NPU), shaped as
    torch's own ``_dist2`` factories build theirs; ``options`` set fields of ``ProcessGroupHCCL.Options``."""
    import torch_npu  # noqa: F401  loads the CANN runtime and torch_npu's c10d extension
    from torch.distributed import ProcessGroup
    from torch_npu._C._distributed_c10d import ProcessGroupHCCL

    opts = ProcessGroupHCCL.Options()
    opts._timeout = timeout
    for key, value in options.items():
        if not hasattr(opts, key):
            raise KeyError(f"hccl group option {key!r} is not a field of ProcessGroupHCCL.Options")
        setattr(opts, key, value)
    backend = ProcessGroupHCCL(store, rank, world_size, opts)
    group = ProcessGroup(store, rank, world_size)
    group._set_default_backend(ProcessGroup.BackendType.CUSTOM)
    group._register_backend(device, ProcessGroup.BackendType.CUSTOM, backend)
    return group

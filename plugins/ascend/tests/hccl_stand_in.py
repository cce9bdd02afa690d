"""HCCL's stand-in for the transport tests on a CPU machine: gloo, registered under the name ``hccl``.

What the tests check is the HCCL transport's own logic (it refuses other backends, looks its group
factory up by the platform's backend name, and carries core's broadcast protocol and bucketing); the
collective library underneath is replaced, because CI has no NPU. :func:`register_hccl_factory` sees a
factory registered and leaves it, exactly as it would leave one a newer torch_npu ships.
"""

from __future__ import annotations

import torch
from rlcore.testing.fake_device import FakeDevicePlatform
from rlcore.weights import bucketize
from torch.distributed import _dist2

BUCKET_BYTES = 4096


class HCCLOnCPU(FakeDevicePlatform):
    """A CPU-backed platform whose collective backend is named ``hccl``."""

    name = "hccl-on-cpu"
    dist_backend = "hccl"


def install() -> None:
    _dist2._BACKENDS["hccl"] = _dist2._BACKENDS["gloo"]


def named_tensors(seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        ("embed.weight", torch.randn(64, 48, generator=g).to(torch.bfloat16)),  # split across buckets
        ("layer.weight", torch.randn(16, 8, generator=g).t()),  # not contiguous
        ("layer.bias", torch.randn(7, generator=g)),
        ("step", torch.tensor(seed, dtype=torch.int64)),
        ("lm_head.weight", torch.randn(40, 48, generator=g, dtype=torch.float64)),
    ]


def buckets(seed: int) -> list:
    return list(bucketize(named_tensors(seed), BUCKET_BYTES))


def digest(stream) -> list[list[list]]:
    """Per bucket, per tensor: name, dtype, shape and the exact values (as float64 lists)."""
    return [
        [[n, str(t.dtype), list(t.shape), t.double().reshape(-1).tolist()] for n, t in bucket]
        for bucket in stream
    ]

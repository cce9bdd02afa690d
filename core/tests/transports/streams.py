"""A weight stream exercising every corner a transport must carry bit-exactly, and its comparison.

Imported by path from the tests and run as a script by the broadcast receivers (separate processes).
"""

import hashlib

import torch
from rlcore.weights import bucketize

BUCKET_BYTES = 4096


def named_tensors(seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        ("embed.weight", torch.randn(64, 48, generator=g)),  # 12 KiB: split across buckets
        ("layer.bias", torch.randn(7, generator=g).to(torch.bfloat16)),  # no numpy dtype
        ("layer.weight", torch.randn(16, 8, generator=g).t()),  # not contiguous
        ("layer.strided", torch.randn(4, 6, generator=g)[:, ::2]),  # flattens to a strided view
        ("step", torch.tensor(3 + seed, dtype=torch.int64)),  # 0-dim
        ("mask", torch.rand(5, generator=g) > 0.5),
        ("empty", torch.zeros(0, 4)),
        ("head.weight", torch.randn(10, 10, generator=g, dtype=torch.float64)),
    ]


def buckets(seed: int = 0) -> list[list[tuple[str, torch.Tensor]]]:
    return list(bucketize(named_tensors(seed), BUCKET_BYTES))


def fingerprint(stream) -> list[list[tuple[str, str, tuple[int, ...], str]]]:
    """Per bucket, per tensor: name, dtype, shape and a hash of its bytes (bit-exact comparison)."""
    out = []
    for bucket in stream:
        out.append(
            [
                (
                    name,
                    str(t.dtype),
                    tuple(t.shape),
                    hashlib.sha256(
                        t.cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                    ).hexdigest(),
                )
                for name, t in bucket
            ]
        )
    return out

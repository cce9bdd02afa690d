"""Per-sync statistics that every transport records, as metrics."""

from __future__ import annotations

from rlcore.api import WeightBucket
from rlcore.weights import tensor_bytes


def bucket_bytes(bucket: WeightBucket) -> int:
    """Payload bytes of one bucket."""
    return sum(tensor_bytes(t) for _, t in bucket)


def send_stats(nbytes: int, seconds: float, buckets: int) -> dict[str, float]:
    """What :meth:`WeightTransport.send` leaves in ``last_stats``."""
    return {"sync/bytes": float(nbytes), "sync/seconds": seconds, "sync/buckets": float(buckets)}


def receive_stats(nbytes: int, seconds: float, buckets: int) -> dict[str, float]:
    """What a finished :meth:`WeightTransport.receive` leaves in ``last_receive_stats``. ``seconds``
    counts time inside the transport only, not the consumer's work between buckets."""
    return {
        "sync/receive_bytes": float(nbytes),
        "sync/receive_seconds": seconds,
        "sync/receive_buckets": float(buckets),
    }

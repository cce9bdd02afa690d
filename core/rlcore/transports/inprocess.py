"""``inprocess``: the trainer rank and the rollout engine live in one process (colocated workers).

Zero copy: the handle holds the sender's bucket tensors themselves, so the sender must not modify or
reuse them until every receiver has loaded them. The handle refuses to be pickled: it is meaningless in
another process (use ``ray`` or ``broadcast`` there).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

from rlcore.api import WeightBucket, WeightTransport
from rlcore.transports.config import TransportConfig
from rlcore.transports.stats import bucket_bytes, receive_stats, send_stats


class InProcessHandle:
    """The buckets of one sync, by reference."""

    __slots__ = ("buckets",)

    def __init__(self, buckets: list[WeightBucket]):
        self.buckets = buckets

    def __reduce__(self):
        raise TypeError(
            "an 'inprocess' weight-transport handle cannot leave its process (it holds the tensors "
            "themselves); when the rollout runs in another process set transport.name to 'ray' or 'broadcast'"
        )


class InProcessTransport(WeightTransport):
    config_class = TransportConfig

    def __init__(self, config: TransportConfig | None = None, platform: Any = None):
        self.config = config if config is not None else TransportConfig(name="inprocess")
        self.platform = platform
        self.last_stats: dict[str, float] = {}
        self.last_receive_stats: dict[str, float] = {}

    def send(self, buckets: Iterable[WeightBucket]) -> InProcessHandle:
        """Drain the (possibly lazy) bucket iterator into a handle; nothing is copied."""
        start = time.perf_counter()
        held = [list(bucket) for bucket in buckets]
        seconds = time.perf_counter() - start
        self.last_stats = send_stats(sum(bucket_bytes(b) for b in held), seconds, len(held))
        return InProcessHandle(held)

    def receive(self, handle: InProcessHandle) -> Iterator[WeightBucket]:
        if not isinstance(handle, InProcessHandle):
            raise TypeError(
                f"'inprocess' transport got a {type(handle).__name__} handle; pass what its send() returned"
            )
        nbytes = 0
        for bucket in handle.buckets:
            nbytes += bucket_bytes(bucket)
            yield bucket
        self.last_receive_stats = receive_stats(nbytes, 0.0, len(handle.buckets))

"""The weight transport contract: moving the weight stream from trainer ranks to rollout engines."""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from rlcore.api.train_engine import WeightBucket


class WeightTransport(abc.ABC):
    """Moves buckets of ``(hf_name, tensor)`` from the sender (a trainer rank holding full weights) to
    receivers (rollout engines).

    :meth:`send` runs in the sender's process and returns a picklable ``handle``; the controller passes
    the handle to every receiver, which iterates :meth:`receive`. Transports that stream through a
    collective (broadcast) need :meth:`send` and :meth:`receive` to run concurrently; the controller
    starts both before waiting on either.

    A transport whose receiving end is the engine itself (SGLang's scheduler joining an NCCL group) adds
    ``attach(engine)``, ``receiver_ranks() -> int`` and ``load_into(engine, handle)``, and may name the
    placements and rollout engines it works with in the class attributes ``placements`` and
    ``rollout_engines`` (docs/plugins.md, "Weight transports").
    """

    config_class: ClassVar[type | None] = None

    @abc.abstractmethod
    def send(self, buckets: Iterable[WeightBucket]) -> Any:
        """Ship ``buckets``; return the handle receivers need. Records ``self.last_stats``."""

    @abc.abstractmethod
    def receive(self, handle: Any) -> Iterator[WeightBucket]:
        """Yield the buckets behind ``handle`` in order, as tensors in this process."""

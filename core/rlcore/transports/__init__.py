"""Weight transports: moving the weight stream from a trainer rank to rollout engines.

Built in (registered as default plugins): ``inprocess`` (:mod:`rlcore.transports.inprocess`), ``ray``
(:mod:`rlcore.transports.ray_object_store`) and ``broadcast`` (:mod:`rlcore.transports.broadcast`). Every
transport is constructed as ``cls(config: TransportConfig, platform: DevicePlatform | None)`` and
records ``last_stats`` after :meth:`send` (``sync/bytes``, ``sync/seconds``, ``sync/buckets``) and
``last_receive_stats`` after a completed :meth:`receive` (``sync/receive_*``).
"""

from __future__ import annotations

from typing import Any

from rlcore.transports.config import TransportConfig


def build_transport(config: TransportConfig, platform: Any = None) -> Any:
    """The :class:`~rlcore.api.WeightTransport` registered as ``config.name``, constructed."""
    from rlcore.plugins import registry

    return registry("weight_transports").get(config.name)(config, platform)


__all__ = ["TransportConfig", "build_transport"]

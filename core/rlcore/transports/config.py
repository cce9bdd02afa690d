"""The ``transport:`` config section: how weights travel from the trainer to rollout engines."""

from __future__ import annotations

from typing import Any

import attrs


def _positive(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    if value <= 0:
        raise ValueError(f"transport.{attribute.name} must be positive, got {value!r}")


@attrs.define(kw_only=True)
class TransportConfig:
    """Shared by every weight transport; ``name`` selects one from the ``weight_transports`` registry."""

    #: ``inprocess`` (trainer rank and rollout engine in one process: zero copy), ``ray`` (the Ray object
    #: store: works across processes and nodes), ``broadcast`` (torch.distributed broadcast from trainer
    #: rank 0 to every rollout engine over the platform's collective backend: gloo, NCCL, HCCL), ``ipc``
    #: (device buffers shared by handle between processes of one node: colocated roles on GPUs).
    name: str = "ray"
    #: Upper bound of one bucket of the weight stream, in bytes (the trainer exports in buckets of this
    #: size; larger tensors are split). Bounds the transport's extra memory per step.
    bucket_bytes: int = attrs.field(default=256 * 2**20, validator=_positive)
    #: Seconds a collective transport waits for its peers (group setup and each broadcast).
    timeout_s: float = attrs.field(default=600.0, validator=_positive)

"""The default micro-batch: a worker turns ``max_tokens_per_micro_batch: "auto"`` into a token budget for
its device before it builds the engine, with the estimate of :mod:`rlcore.api.memory` (which engines may
use too: the FSDP engine's ``auto`` settings do). The module doc there says how the budget is counted.
"""

from __future__ import annotations

import sys

import attrs

from rlcore.api import EngineSpec
from rlcore.api.memory import (  # noqa: F401 - the estimate's names, as this module has long offered them
    ACTIVATION_FRACTION,
    AUTO,
    MAX_TOKENS,
    OVERHEAD,
    ModelShape,
    auto_budget,
    model_shape,
    token_budget,
)


def resolve(
    spec: EngineSpec, *, device_bytes: float, shards: int, activation_dtype: str | None = None
) -> EngineSpec:
    """``spec`` with ``max_tokens_per_micro_batch="auto"`` replaced by a budget for this device, and
    ``micro_batch_size`` by the rows of ``spec.max_sequence_length`` tokens that fit it; any other spec
    unchanged. ``activation_dtype``: the engine's compute dtype (default ``spec.dtype``)."""
    if spec.max_tokens_per_micro_batch != AUTO:
        return spec
    longest = spec.max_sequence_length or 1
    budget = auto_budget(spec, device_bytes=device_bytes, shards=shards, activation_dtype=activation_dtype)
    rows = max(1, budget // max(1, longest))
    # stderr: the worker's log file (runs/<name>/logs/<role>-<rank>.log), the terminal with --verbose
    print(
        f"rlcore: micro-batches of up to {budget} tokens ({rows} rows of {longest}), sized from "
        f"{device_bytes / 2**30:.1f} GiB of device memory; set max_tokens_per_micro_batch or "
        f"micro_batch_size of the role to choose",
        file=sys.stderr,
        flush=True,
    )
    return attrs.evolve(spec, max_tokens_per_micro_batch=budget, micro_batch_size=rows)

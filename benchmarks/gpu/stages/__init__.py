"""The declared stages, by name: every GPU row of docs/benchmarks.md comes from one of them.

``python -m benchmarks.gpu list`` prints this table; ``show STAGE`` the exact commands a stage runs.
"""

from __future__ import annotations

from . import fp8, fsdp, megatron, misc, models, overlap, sglang, step, vision, vllm
from .base import Stage

STAGES: dict[str, Stage] = {}
for _family in (misc, fsdp, megatron, sglang, vllm, step, overlap, models, fp8, vision):
    for _stage in _family.STAGES:
        assert _stage.name not in STAGES, f"stage {_stage.name} declared twice"
        STAGES[_stage.name] = _stage

__all__ = ["STAGES", "Stage"]

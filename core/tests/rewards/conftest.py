"""Fixtures for the reward tests: user reward files and scoring batches."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from rlcore.api import Batch


@pytest.fixture
def user_file(tmp_path: Path) -> Callable[[str], str]:
    """``user_file(source)``: write a Python file holding ``source`` and return its path."""
    counter = iter(range(1000))

    def write(source: str) -> str:
        path = tmp_path / f"my_reward_{next(counter)}.py"
        path.write_text(textwrap.dedent(source))
        return str(path)

    return write


def make_batch(
    samples: list[tuple[str, str, Any]], lengths: list[int], width: int = 8, **objects: Any
) -> Batch:
    """A batch as the rollout hands it to a reward provider: ``(data_source, response, truth)`` per sample,
    and ``lengths[i]`` valid response tokens in ``response_mask [B, width]``."""
    mask = torch.zeros(len(samples), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    fields = {
        "data_source": [s[0] for s in samples],
        "response_text": [s[1] for s in samples],
        "ground_truth": [s[2] for s in samples],
        "extra_info": [{"row": i} for i in range(len(samples))],
        "index": [100 + i for i in range(len(samples))],
    }
    fields.update(objects)
    return Batch(
        {"response_mask": mask, "responses": torch.ones(len(samples), width, dtype=torch.long)}, fields
    )


@pytest.fixture
def batch_of() -> Callable[..., Batch]:
    return make_batch

"""Fixtures for the data tests: the tiny local tokenizer and writers of verl-schema files."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tokenizer():
    from rlcore.testing.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()


def gsm8k_row(i: int, question: str | None = None, **overrides: Any) -> dict[str, Any]:
    row = {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": question or f"What is {i} + {i}?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
        "extra_info": {"split": "train", "index": i},
    }
    row.update(overrides)
    return row


@pytest.fixture
def rows() -> Callable[..., list[dict[str, Any]]]:
    """``rows(n)``: ``n`` gsm8k-style rows in verl's schema."""

    def make(n: int) -> list[dict[str, Any]]:
        return [gsm8k_row(i) for i in range(n)]

    return make


@pytest.fixture
def write(tmp_path: Path) -> Callable[..., str]:
    """``write(name, rows)``: write ``rows`` as parquet or json lines (by the suffix of ``name``)."""

    def write_rows(name: str, data: list[dict[str, Any]]) -> str:
        path = tmp_path / name
        if name.endswith(".parquet"):
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist(data), path)
        else:
            path.write_text("".join(json.dumps(r) + "\n" for r in data))
        return str(path)

    return write_rows

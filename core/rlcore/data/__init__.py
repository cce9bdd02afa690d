"""Prompt data in verl's schema: files -> :class:`RLDataset` -> :class:`PromptLoader` -> ``Batch``.

Importing this package (and :mod:`rlcore.data.config`) does not import torch; the loader is imported on
first use.

>>> from rlcore.data import DataConfig, build_train_loader  # doctest: +SKIP
>>> loader = build_train_loader(DataConfig(train_files=["gsm8k/train.parquet"]), tokenizer)  # doctest: +SKIP
>>> batch = next(iter(loader))  # batch["prompts"]: [B, P], left-padded  # doctest: +SKIP
"""

from typing import Any

from rlcore.data.config import TRUNCATION_MODES, DataConfig
from rlcore.data.files import DataError, read_file

__all__ = [
    "TRUNCATION_MODES",
    "DataConfig",
    "DataError",
    "PromptLoader",
    "RLDataset",
    "build_train_loader",
    "build_val_loader",
    "read_file",
    "truncate",
]

_LAZY = {
    "RLDataset": "rlcore.data.dataset",
    "truncate": "rlcore.data.dataset",
    "PromptLoader": "rlcore.data.loader",
    "build_train_loader": "rlcore.data.loader",
    "build_val_loader": "rlcore.data.loader",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rlcore.data' has no attribute {name!r}")

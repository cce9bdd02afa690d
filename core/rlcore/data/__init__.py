"""Prompt data in verl's schema: files -> :class:`RLDataset` -> :class:`PromptLoader` -> ``Batch``.

>>> from rlcore.data import DataConfig, build_train_loader  # doctest: +SKIP
>>> loader = build_train_loader(DataConfig(train_files=["gsm8k/train.parquet"]), tokenizer)  # doctest: +SKIP
>>> batch = next(iter(loader))  # batch["prompts"]: [B, P], left-padded  # doctest: +SKIP
"""

from rlcore.data.config import TRUNCATION_MODES, DataConfig
from rlcore.data.dataset import RLDataset, truncate
from rlcore.data.files import DataError, read_file
from rlcore.data.loader import PromptLoader, build_train_loader, build_val_loader

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

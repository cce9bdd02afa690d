"""The ``data:`` section of the config: which prompt files to read and how to batch them."""

from __future__ import annotations

from typing import Any

import attrs

from rlcore.data.files import SUPPORTED_SUFFIXES

TRUNCATION_MODES = ("error", "left", "right", "middle")


def _positive(instance: Any, attribute: attrs.Attribute, value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"data.{attribute.name} must be a positive integer, got {value!r}")


def _truncation(instance: Any, attribute: attrs.Attribute, value: str) -> None:
    if value not in TRUNCATION_MODES:
        raise ValueError(f"data.truncation must be one of {', '.join(TRUNCATION_MODES)}; got {value!r}")


def _file_list(instance: Any, attribute: attrs.Attribute, value: list[str]) -> None:
    key = f"data.{attribute.name}"
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{key} must be a list of file paths, got {value!r}")
    if len(value) > 1 and all(len(v) == 1 for v in value):
        # What a structuring layer makes of a bare string given for a list.
        raise ValueError(
            f"{key} looks like one path split into characters ({''.join(value)!r}); write it as a list: "
            f"{key}=[{''.join(value)}]"
        )
    for i, path in enumerate(value):
        if not path.lower().endswith(SUPPORTED_SUFFIXES):
            raise ValueError(
                f"{key}[{i}] = {path!r} is not a {', '.join(SUPPORTED_SUFFIXES)} file; rlcore reads prompt data "
                "in verl's schema from those."
            )


@attrs.define(kw_only=True)
class DataConfig:
    """Prompt data in verl's schema (parquet or jsonl) and how the controller batches it."""

    #: Training files (``.parquet``, ``.jsonl`` or ``.json`` lines); rows of all files are concatenated.
    train_files: list[str] = attrs.field(factory=list, validator=_file_list)
    #: Validation files; empty means no validation set.
    val_files: list[str] = attrs.field(factory=list, validator=_file_list)
    #: Column holding the chat messages ``[{"role": "user", "content": ...}, ...]``.
    prompt_key: str = "prompt"
    #: Longest prompt in tokens (after the chat template). Longer prompts are filtered or truncated.
    max_prompt_length: int = attrs.field(default=512, validator=_positive)
    #: What to do with a prompt longer than ``max_prompt_length`` that was not filtered out:
    #: ``error`` (stop, naming the row), ``left`` (keep the end), ``right`` (keep the start),
    #: ``middle`` (keep both ends, drop the middle).
    truncation: str = attrs.field(default="error", validator=_truncation)
    #: Drop prompts longer than ``max_prompt_length`` when loading (the count is logged).
    filter_overlong_prompts: bool = True
    #: Shuffle the training set each epoch (seeded by ``seed`` and the epoch number).
    shuffle: bool = True
    #: Seed of the per-epoch shuffle.
    seed: int = 0
    #: Prompts per training batch (before the rollout repeats each prompt ``n`` times).
    train_batch_size: int = attrs.field(default=256, validator=_positive)
    #: Prompts per validation batch; ``None`` scores the whole validation set as one batch.
    val_batch_size: int | None = attrs.field(default=None, validator=_positive)
    #: Render the messages with the tokenizer's chat template (with the generation prompt). When false,
    #: the prompt is used as raw text: a string column as-is, or the messages' contents joined by newlines.
    apply_chat_template: bool = True
    #: Column holding each row's images (vision-language models, docs/vision.md): a list of paths
    #: (relative to the data file's folder), encoded bytes, or ``{"bytes": ..., "path": ...}`` dicts; each
    #: ``<image>`` in the prompt's text marks where the next one goes. Read and checked when the data loads.
    image_key: str = "images"
    #: Extra keyword arguments for ``tokenizer.apply_chat_template`` (e.g. ``{enable_thinking: false}``).
    apply_chat_template_kwargs: dict[str, Any] = attrs.field(factory=dict)
    #: Drop the last incomplete training batch of each epoch (validation always keeps it).
    dataloader_drop_last: bool = True

"""verl's prompt-data schema, checked row by row.

A row has ``prompt`` (chat messages ``[{"role": "user", "content": "..."}]``; the column name is
configurable), ``data_source`` (names the reward function), ``reward_model`` (``{"style": "rule",
"ground_truth": ...}``), optionally ``extra_info`` (a dict handed to the reward function) and any other
columns, which travel along with the sample.
"""

from __future__ import annotations

from typing import Any

import attrs

from rlcore.data.files import DataError, LoadedFile

REQUIRED_COLUMNS = ("data_source", "reward_model")

#: Names the loader itself puts in a batch; a data column with one of these names is not carried.
RESERVED_NAMES = frozenset(
    {
        "prompts",
        "prompt_mask",
        "attention_mask",
        "raw_prompt",
        "data_source",
        "ground_truth",
        "reward_model",
        "extra_info",
        "index",
        "multi_modal_data",
    }
)

SCHEMA_HINT = (
    'rlcore reads verl\'s schema: prompt=[{"role": "user", "content": ...}], data_source=str, '
    'reward_model={"style": "rule", "ground_truth": ...}, extra_info=dict (optional).'
)


@attrs.define
class Sample:
    """One validated row. ``prompt`` is a list of messages, or a string when raw text is allowed."""

    prompt: list[dict[str, Any]] | str
    data_source: str
    ground_truth: Any
    reward_model: dict[str, Any]
    extra_info: dict[str, Any]
    #: Columns beyond the schema (``ability`` ...), carried to the batch under their own names.
    extras: dict[str, Any]


def check_columns(loaded: LoadedFile, prompt_key: str) -> None:
    """Fail on a file whose schema lacks a required column (parquet: checked once for the file)."""
    required = (prompt_key, *REQUIRED_COLUMNS)
    if loaded.lines is not None:  # json lines: every row carries its own keys, checked per row
        for i, row in enumerate(loaded.rows):
            missing = [c for c in required if c not in row]
            if missing:
                raise DataError(
                    f"{loaded.where(i)} has no key {missing[0]!r} (keys present: {sorted(row)}). "
                    f"{_prompt_key_hint(prompt_key, row)}{SCHEMA_HINT}"
                )
        return
    missing = [c for c in required if c not in loaded.columns]
    if missing:
        raise DataError(
            f"data file {loaded.path!r} has no column {missing[0]!r} "
            f"(columns present: {sorted(loaded.columns)}). "
            f"{_prompt_key_hint(prompt_key, loaded.columns)}{SCHEMA_HINT}"
        )


def _prompt_key_hint(prompt_key: str, present: Any) -> str:
    if prompt_key not in present:
        return "If the prompt is in another column, set data.prompt_key to its name. "
    return ""


def parse_row(loaded: LoadedFile, i: int, prompt_key: str, allow_text_prompt: bool) -> Sample:
    """Validate row ``i`` of ``loaded`` and return it as a :class:`Sample`."""
    row = loaded.rows[i]
    where = loaded.where(i)
    prompt = _check_prompt(row[prompt_key], where, prompt_key, allow_text_prompt)

    data_source = row["data_source"]
    if not isinstance(data_source, str) or not data_source:
        raise DataError(
            f"{where}, column 'data_source': expected a non-empty string naming the reward function "
            f"(e.g. 'openai/gsm8k'), got {data_source!r}."
        )

    reward_model = row["reward_model"]
    if not isinstance(reward_model, dict):
        raise DataError(
            f"{where}, column 'reward_model': expected a dict like "
            f"{{'style': 'rule', 'ground_truth': ...}}, got {type(reward_model).__name__} {_short(reward_model)}."
        )
    style = reward_model.get("style") or "rule"
    ground_truth = reward_model.get("ground_truth")
    # A reward model scores without a reference answer; rule scoring cannot.
    if style == "rule" and ground_truth is None:
        raise DataError(
            f"{where}, column 'reward_model': style 'rule' needs 'ground_truth' (the reference answer), "
            f"but it is missing or null (got {_short(reward_model)}). Add reward_model.ground_truth to the data."
        )

    extra_info = row.get("extra_info")
    if extra_info is None:
        extra_info = {}
    elif not isinstance(extra_info, dict):
        raise DataError(
            f"{where}, column 'extra_info': expected a dict (or null), got {type(extra_info).__name__} "
            f"{_short(extra_info)}."
        )

    extras = {k: v for k, v in row.items() if k not in RESERVED_NAMES and k not in (prompt_key, "extra_info")}
    return Sample(prompt, data_source, ground_truth, reward_model, extra_info, extras)


def _check_prompt(prompt: Any, where: str, key: str, allow_text: bool) -> list[dict[str, Any]] | str:
    if isinstance(prompt, str):
        if allow_text:
            return prompt
        raise DataError(
            f"{where}, column {key!r}: expected a list of chat messages "
            f'[{{"role": "user", "content": ...}}], got the string {_short(prompt)}. Convert the data to '
            "messages, or set data.apply_chat_template=false to use the text as the prompt."
        )
    if not isinstance(prompt, list) or not prompt:
        raise DataError(
            f"{where}, column {key!r}: expected a non-empty list of chat messages "
            f'[{{"role": "user", "content": ...}}], got {type(prompt).__name__} {_short(prompt)}.'
        )
    for j, message in enumerate(prompt):
        if (
            not isinstance(message, dict)
            or not isinstance(message.get("role"), str)
            or message.get("content") is None
        ):
            raise DataError(
                f"{where}, column {key!r}, message {j}: expected a dict with a string 'role' and a "
                f"'content', got {_short(message)}."
            )
    return prompt


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

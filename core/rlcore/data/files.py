"""Reading prompt files (parquet, jsonl) into rows, with errors that name the file and line."""

from __future__ import annotations

import json
import os
from typing import Any

import attrs

SUPPORTED_SUFFIXES = (".parquet", ".jsonl", ".json")


class DataError(ValueError):
    """A data file or row could not be used; the message names the file, row and column and the fix."""


@attrs.define
class LoadedFile:
    """The rows of one file, as plain Python dicts, plus where each row came from."""

    path: str
    rows: list[dict[str, Any]]
    #: Column names: the parquet schema, or for json lines the keys of the first row.
    columns: list[str]
    #: For json lines, the 1-based line number of each row (blank lines are skipped); ``None`` for parquet.
    lines: list[int] | None = None

    def where(self, row: int) -> str:
        """``file 'x.jsonl', row 3 (line 5)``: rows count from 0, lines from 1."""
        line = f" (line {self.lines[row]})" if self.lines is not None else ""
        return f"file {self.path!r}, row {row}{line}"


def read_file(path: str | os.PathLike) -> LoadedFile:
    """Read every row of a ``.parquet``, ``.jsonl`` or ``.json`` (lines or one array) file."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise DataError(
            f"data file {path!r} does not exist (working directory {os.getcwd()!r}). Check data.train_files / data.val_files."
        )
    if os.path.isdir(path):
        raise DataError(f"data file {path!r} is a directory; list the files in it instead.")
    suffix = os.path.splitext(path)[1].lower()
    if suffix == ".parquet":
        loaded = _read_parquet(path)
    elif suffix in (".jsonl", ".json"):
        loaded = _read_json_lines(path)
    else:
        raise DataError(
            f"data file {path!r} has an unsupported suffix {suffix!r}; rlcore reads "
            f"{', '.join(SUPPORTED_SUFFIXES)} files in verl's schema."
        )
    if not loaded.rows:
        raise DataError(f"data file {path!r} has no rows. Remove it from the file list or regenerate it.")
    return loaded


def _read_parquet(path: str) -> LoadedFile:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(
            f"data file {path!r} is not a readable parquet file ({type(exc).__name__}: {exc}). "
            "It may be truncated (an interrupted download or write) or in another format; regenerate it."
        ) from exc
    return LoadedFile(path, table.to_pylist(), list(table.column_names))


def _read_json_lines(path: str) -> LoadedFile:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as exc:
        raise DataError(
            f"data file {path!r} is not UTF-8 text ({exc}); json lines files must be UTF-8."
        ) from exc
    if path.lower().endswith(".json") and text.lstrip().startswith("["):
        return _read_json_array(path, text)
    rows, lines = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(
                f"data file {path!r}, line {number}: not valid JSON ({exc.msg} at column {exc.colno}). "
                f"Each line of a json lines file must be one JSON object; the line starts {line[:80]!r}."
            ) from exc
        if not isinstance(row, dict):
            raise DataError(
                f"data file {path!r}, line {number}: expected a JSON object (one row), got {type(row).__name__}."
            )
        rows.append(row)
        lines.append(number)
    return LoadedFile(path, rows, list(rows[0]) if rows else [], lines)


def _read_json_array(path: str, text: str) -> LoadedFile:
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(
            f"data file {path!r}, line {exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno})."
        ) from exc
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"data file {path!r}, row {i}: expected a JSON object, got {type(row).__name__}.")
    return LoadedFile(path, rows, list(rows[0]) if rows else [])

"""Images of a dataset row: read, decoded and checked when the data loads, so that a missing or unreadable
image stops the run at start-up naming its file and row, not a rollout deep into training.

A row's image column (``data.image_key``, ``images`` by default, verl's name) holds a list; each entry is

- a path (``str``), relative to the data file's folder unless absolute;
- a dict ``{"bytes": b"...", "path": "..."}`` (Hugging Face ``datasets``' ``Image`` feature, as parquet
  stores it): the bytes when present, else the path;
- raw encoded bytes (PNG, JPEG ...).

Decoded images are RGB ``PIL.Image`` objects: what every engine's processor takes.
"""

from __future__ import annotations

import io
import os
from typing import Any

from rlcore.data.files import DataError


def load_images(value: Any, *, base_dir: str, where: str, key: str = "images") -> list[Any]:
    """The decoded RGB images of one row's image column ``value`` (a list, or ``None`` for none).

    ``base_dir``: the folder relative paths start from (the data file's); ``where``: the row, for
    messages (``file 'x.jsonl', row 3 (line 4)``); ``key``: the column's name."""
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise DataError(
            f"{where}, column {key!r}: expected a list of images (paths, bytes or {{'bytes': ..., 'path': ...}}), "
            f"got {type(value).__name__}"
        )
    return [_load_one(item, base_dir, f"{where}, column {key!r}, image {j}") for j, item in enumerate(value)]


def _load_one(item: Any, base_dir: str, where: str) -> Any:
    from PIL import Image, UnidentifiedImageError

    if isinstance(item, dict):
        data, path = item.get("bytes"), item.get("path")
        if data is None and not path:
            raise DataError(f"{where}: a dict image needs 'bytes' or 'path', got keys {sorted(item)}")
        item = data if data is not None else path
    if isinstance(item, str):
        path = item if os.path.isabs(item) else os.path.join(base_dir, item)
        if not os.path.isfile(path):
            raise DataError(
                f"{where}: image file {path!r} does not exist (relative paths start at the data file's folder "
                f"{base_dir!r}); fix the path or regenerate the data"
            )
        source, what = path, f"image file {path!r}"
    elif isinstance(item, bytes | bytearray | memoryview):
        source, what = io.BytesIO(bytes(item)), f"its {len(item)} image bytes"
    else:
        raise DataError(
            f"{where}: expected a path, bytes or a dict with 'bytes'/'path', got {type(item).__name__}"
        )
    try:
        with Image.open(source) as image:
            # convert() decodes the whole file now: a truncated image fails here, not in a rollout.
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise DataError(
            f"{where}: {what} could not be read as an image ({type(exc).__name__}: {exc}); it may be truncated "
            "or in a format Pillow does not read"
        ) from exc

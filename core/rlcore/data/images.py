"""Images of a dataset row (vision-language models, docs/vision.md): read, decoded and checked when the
data loads, so that a missing or unreadable image stops the run at start-up naming its file and row, not a
rollout deep into training; and where they sit in the prompt.

A row's image column (``data.image_key``, ``images`` by default, verl's name) holds a list; each entry is

- a path (``str``), relative to the data file's folder unless absolute;
- a dict ``{"bytes": b"...", "path": "..."}`` (Hugging Face ``datasets``' ``Image`` feature, as parquet
  stores it): the bytes when present, else the path;
- raw encoded bytes (PNG, JPEG ...).

Decoded images are RGB ``PIL.Image`` objects: what every engine's processor takes.

The prompt marks each image's place with the literal ``<image>`` in a message's text (verl's and geo3k's
convention); the ``i``-th ``<image>`` of the prompt is the row's ``i``-th image. A message whose content is
already a list of parts (``{"type": "image"}``, ``{"type": "text", "text": ...}``, the chat API's form) is
taken as it is. A chat template renders each image part as the model's vision block
(``<|vision_start|><|image_pad|><|vision_end|>`` for Qwen-VL): one image token per image, the prompt every
rollout engine receives (:mod:`rlcore.vision.inputs` expands it to what the model reads).

>>> image_parts([{"role": "user", "content": "<image>How many?"}], 1, "row 0")
[{'role': 'user', 'content': [{'type': 'image'}, {'type': 'text', 'text': 'How many?'}]}]
"""

from __future__ import annotations

import io
import os
import re
from typing import Any

from rlcore.data.files import DataError

IMAGE_PLACEHOLDER = "<image>"
_SPLIT = re.compile(f"({re.escape(IMAGE_PLACEHOLDER)})")


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


def prompt_images(
    prompt: Any, value: Any, *, data_file: str, where: str, key: str = "images"
) -> tuple[Any, list[Any]]:
    """A row's prompt and its decoded images: ``value`` (the row's image column) read with paths relative
    to ``data_file``'s folder (:func:`load_images`), and the prompt's ``<image>`` places made image parts
    (:func:`image_parts`); ``(prompt, [])`` for a row without images. Images need chat messages, whose
    template renders each image's place: a text prompt with images is an error naming the row."""
    images = load_images(value, base_dir=os.path.dirname(os.path.abspath(data_file)), where=where, key=key)
    if not images:
        return prompt, []
    if not isinstance(prompt, list):
        raise DataError(
            f"{where}: a row with images needs chat messages (data.apply_chat_template=true), whose "
            f"template renders each image's place"
        )
    return image_parts(prompt, len(images), where), images


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


def image_parts(messages: list[dict[str, Any]], num_images: int, where: str) -> list[dict[str, Any]]:
    """``messages`` with each text's ``<image>`` turned into an image part, checked against the row's
    ``num_images``: every image needs its place in the prompt and every place its image."""
    out, places = [], 0
    for message in messages:
        content = message["content"]
        if isinstance(content, str):
            parts = [
                {"type": "image"} if piece == IMAGE_PLACEHOLDER else {"type": "text", "text": piece}
                for piece in _SPLIT.split(content)
                if piece
            ]
            message = {**message, "content": parts}
        places += sum(1 for p in message["content"] if isinstance(p, dict) and p.get("type") == "image")
        out.append(message)
    if places != num_images:
        raise DataError(
            f"{where}: the prompt has {places} image places ({IMAGE_PLACEHOLDER!r} in its text, or image parts) "
            f"but the row has {num_images} images; put one {IMAGE_PLACEHOLDER} where each image goes"
        )
    return out

"""Where images sit in a prompt: the ``<image>`` placeholder of the data, the content parts a chat template
takes, and the image tokens each engine expands.

The data marks each image's place with the literal ``<image>`` in a message's text (verl's and geo3k's
convention); the ``i``-th ``<image>`` of the prompt is the row's ``i``-th image. A message whose content is
already a list of parts (``{"type": "image"}``, ``{"type": "text", "text": ...}``, the chat API's form) is
taken as it is. A chat template renders each image part as the model's vision block
(``<|vision_start|><|image_pad|><|vision_end|>`` for Qwen-VL): one image token per image, the prompt every
rollout engine receives. The model reads ``n_i`` copies of that token for image ``i`` (its patches after
merging), so the trained sequence holds the expanded prompt (:func:`expand_image_tokens`).

>>> image_parts([{"role": "user", "content": "<image>How many?"}], 1, "row 0")
[{'role': 'user', 'content': [{'type': 'image'}, {'type': 'text', 'text': 'How many?'}]}]
>>> expand_image_tokens([1, 9, 2, 9], image_token_id=9, counts=[2, 3])
[1, 9, 9, 2, 9, 9, 9]
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from rlcore.data.files import DataError

IMAGE_PLACEHOLDER = "<image>"
_SPLIT = re.compile(f"({re.escape(IMAGE_PLACEHOLDER)})")


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


def expand_image_tokens(
    prompt_ids: Sequence[int], *, image_token_id: int, counts: Sequence[int]
) -> list[int]:
    """``prompt_ids`` with its ``i``-th ``image_token_id`` repeated ``counts[i]`` times: the prompt as the
    model reads it. The token must occur exactly ``len(counts)`` times."""
    places = [i for i, t in enumerate(prompt_ids) if t == image_token_id]
    if len(places) != len(counts):
        raise ValueError(
            f"the prompt holds the image token {image_token_id} {len(places)} times, for {len(counts)} images; "
            "was it expanded already, or does the text contain the token literally?"
        )
    out: list[int] = []
    start = 0
    for place, count in zip(places, counts, strict=True):
        out.extend(prompt_ids[start:place])
        out.extend([image_token_id] * count)
        start = place + 1
    out.extend(prompt_ids[start:])
    return out

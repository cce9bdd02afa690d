"""A vision-language model's inputs, made by the model's own processor from its folder: the image tokens
each image becomes, the pixels the vision tower reads, and which tokens are image tokens.

Engines and the trainer build these from the same images with this one class, so a prompt's expanded
image tokens and the pixels agree everywhere.

Shapes (Qwen2.5-VL, Qwen3-VL): ``pixel_values [N, C]`` (``N``: the patches of every image of a call, in
order; ``C = channels * temporal_patch_size * patch_size**2``), ``image_grid_thw [I, 3]`` (frames, rows and
columns of patches of each of the ``I`` images), ``mm_token_type_ids [b, T]`` (1 on image tokens, which
the model's 3-D rotary positions need). Image ``i`` becomes ``prod(image_grid_thw[i]) // merge_size**2``
tokens.

A request's media (``multi_modal``, verl's ``multi_modal_data``) is a mapping ``{"image": [PIL.Image, ...]}``
per prompt, or ``None`` for a prompt without images.

>>> expand_image_tokens([1, 9, 2, 9], image_token_id=9, counts=[2, 3])
[1, 9, 9, 2, 9, 9, 9]
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

#: The media kinds a request may carry.
MODALITIES = ("image",)
#: The logit bias of a vision model's image tokens in every engine (vLLM's ``logit_bias`` takes it as is):
#: their probability becomes ``exp(-100)`` of what it was, zero to float32.
BANNED_LOGIT = -100.0


def is_vision_model(model_path: str | os.PathLike) -> bool:
    """Whether the model folder's ``config.json`` declares a vision tower (``vision_config``)."""
    config = os.path.join(os.fspath(model_path), "config.json")
    if not os.path.isfile(config):
        return False
    with open(config, encoding="utf-8") as f:
        return "vision_config" in json.load(f)


def model_class(model_path: str | os.PathLike) -> Any:
    """The ``transformers`` auto class that loads the folder: image-text-to-text for a vision model
    (``Qwen2_5_VLForConditionalGeneration`` ...), else the causal LM."""
    import transformers

    if is_vision_model(model_path):
        return transformers.AutoModelForImageTextToText
    return transformers.AutoModelForCausalLM


class VisionInputs:
    """A folder's processor (``AutoProcessor``) and its image token."""

    def __init__(self, processor: Any, image_token_id: int, video_token_id: int | None = None):
        self.processor = processor
        self.tokenizer = processor.tokenizer
        #: The token a chat template writes once per image and the model reads ``n_i`` times.
        self.image_token_id = int(image_token_id)
        self.merge_size = int(getattr(processor.image_processor, "merge_size", 1))
        #: Tokens no response may hold: the model takes every image (or video) token of its input for an
        #: image's place (``transformers`` counts them to place the image features), so a response holding
        #: one could not be trained on. Every engine adds :data:`BANNED_LOGIT` to their logits, rollouts
        #: and trainer alike: a vision model's policy is its distribution without them, the same everywhere.
        self.banned_token_ids = tuple(sorted({self.image_token_id, *_optional_ids(video_token_id)}))

    @classmethod
    def for_model(cls, model_path: str | os.PathLike) -> VisionInputs | None:
        """The folder's image inputs, or ``None`` for a text-only model."""
        if not is_vision_model(model_path):
            return None
        from transformers import AutoConfig, AutoProcessor

        path = os.fspath(model_path)
        try:
            processor = AutoProcessor.from_pretrained(path)
        except (OSError, ValueError, ImportError) as exc:
            raise ValueError(
                f"model folder {path!r} declares a vision tower, but its processor could not be loaded "
                f"({type(exc).__name__}: {exc}); the folder needs the processor's files (processor_config.json "
                "or preprocessor_config.json) beside the tokenizer, as the processor's save_pretrained writes them"
            ) from exc
        config = AutoConfig.from_pretrained(path)
        return cls(processor, config.image_token_id, getattr(config, "video_token_id", None))

    def image_inputs(self, images: Sequence[Any]) -> dict[str, Any]:
        """``pixel_values [N, C]`` (float32) and ``image_grid_thw [I, 3]`` of ``images`` (RGB ``PIL.Image``)."""
        out = self.processor.image_processor(images=list(images), return_tensors="pt")
        return {"pixel_values": out["pixel_values"].float(), "image_grid_thw": out["image_grid_thw"]}

    def tokens_per_image(self, image_grid_thw: Any) -> list[int]:
        """How many image tokens each image of ``image_grid_thw [I, 3]`` becomes in the model's input."""
        return [int(t * h * w) // self.merge_size**2 for t, h, w in image_grid_thw.tolist()]

    def prompt_inputs(
        self, prompt_ids: Sequence[int], media: Mapping | None
    ) -> tuple[list[int], dict | None]:
        """``prompt_ids`` (one image token per image) as the model reads it, each image's token repeated
        for its patches, and its images' :meth:`image_inputs` (None without images): the images are
        processed once per prompt, however many rows sample from it."""
        images = images_of(media)
        if not images:
            return list(prompt_ids), None
        inputs = self.image_inputs(images)
        counts = self.tokens_per_image(inputs["image_grid_thw"])
        return expand_image_tokens(prompt_ids, image_token_id=self.image_token_id, counts=counts), inputs

    def batch_inputs(self, input_ids: Any, row_inputs: Sequence[dict | None]) -> dict[str, Any]:
        """The model's image inputs for rows ``input_ids [b, T]`` (expanded prompts, any padding) whose
        images' :meth:`image_inputs` are ``row_inputs[i]`` (None for a row without images):
        ``pixel_values`` and ``image_grid_thw`` of all rows' images in row order, and
        ``mm_token_type_ids [b, T]``. ``{}`` when no row has an image."""
        parts = [r for r in row_inputs if r is not None]
        if not parts:
            return {}
        out = {key: torch.cat([r[key] for r in parts]) for key in ("pixel_values", "image_grid_thw")}
        expected = sum(self.tokens_per_image(out["image_grid_thw"]))
        is_image = input_ids == self.image_token_id
        if int(is_image.sum()) != expected:
            raise ValueError(
                f"the rows hold {int(is_image.sum())} image tokens but their {len(out['image_grid_thw'])} "
                f"images make {expected}: the prompts were not expanded for these images "
                "(VisionInputs.prompt_inputs)"
            )
        return {**out, "mm_token_type_ids": is_image.int()}


def _optional_ids(value: int | None) -> tuple[int, ...]:
    return () if value is None else (int(value),)


def images_of(media: Mapping | None) -> list[Any]:
    """The images of one prompt's media (``[]`` for ``None``)."""
    return list((media or {}).get("image") or ())


def check_multi_modal(
    multi_modal: Sequence[Mapping | None] | None,
    num_prompts: int,
    vision: VisionInputs | None,
    *,
    engine: str,
) -> list[Mapping | None] | None:
    """A request's media, one entry per prompt, or ``None`` when no prompt has any. Media for a model
    without a vision tower, an entry count that is not the prompts', or an unknown kind is an error
    naming the engine."""
    if multi_modal is None:
        return None
    media = list(multi_modal)
    if len(media) != num_prompts:
        raise ValueError(
            f"{engine} rollout: {len(media)} multi_modal entries for {num_prompts} prompts; give one each"
        )
    for i, m in enumerate(media):
        unknown = sorted(set(m or {}) - set(MODALITIES))
        if unknown:
            raise ValueError(
                f"{engine} rollout: prompt {i}'s multi_modal has {unknown}; only {', '.join(MODALITIES)} is supported"
            )
    if not any(images_of(m) for m in media):
        return None
    if vision is None:
        raise ValueError(
            f"{engine} rollout: the prompts carry images but the rollout's model has no vision tower "
            "(its config.json has no vision_config); use a vision-language model folder"
        )
    return media


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

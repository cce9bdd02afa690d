"""Vision-language models in the FSDP engine: a micro-batch's images as the model's inputs, and each
sequence's 3-D rotary positions (M-RoPE), laid out as the text positions are (padded or packed).

A row of a VLM batch is ``prompt + response`` where the prompt holds each image's tokens already expanded
(as the rollout reported it) and ``batch.objects["multi_modal_data"][i]`` holds its images (``{"image":
[PIL.Image, ...]}`` or None). The model's own processor (:class:`rlcore.vision.VisionInputs`) makes the
pixels again from those images; the model's own ``get_rope_index`` gives each sequence's positions,
computed on the sequence alone, so padding and packing do not change them. No response may hold an image
token (transformers would take it for an image's place): every engine biases its logit by
``BANNED_LOGIT``, the head here too, and a response holding one is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from rlcore.api import Batch
from rlcore.vision import VisionInputs
from rlcore.vision.inputs import images_of

#: The batch's per-sample field with each row's images.
MEDIA_KEY = "multi_modal_data"


class VisionLayout:
    """Image inputs and M-RoPE positions of padded ``[b, T]`` batches."""

    def __init__(self, vision: VisionInputs, rope_index: Callable[..., tuple[torch.Tensor, Any]]):
        self.vision = vision
        self.rope_index = (
            rope_index  # the model's get_rope_index(input_ids, mm_token_type_ids=..., image_grid_thw=...)
        )

    def __call__(self, batch: Batch, prompt_width: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(positions [3, b, T], extra)`` for ``batch`` (``input_ids``/``attention_mask [b, T]``, prompts in
        the first ``prompt_width`` columns). ``extra``: ``pixel_values [N, C]`` and ``image_grid_thw [I, 3]``
        of the rows' images in row order and ``mm_token_type_ids [b, T]`` (1 on the prompts' image tokens);
        ``{}`` when no row has an image (the positions are then the text positions on all three rows).
        Padding positions hold 1, as the model's own layout has it."""
        media = batch.objects.get(MEDIA_KEY) or [None] * len(batch)
        input_ids, mask = batch.tensors["input_ids"], batch.tensors["attention_mask"].bool()
        b, T = input_ids.shape
        positions = torch.ones((3, b, T), dtype=torch.long)
        token_types = torch.zeros((b, T), dtype=torch.int32)
        pixels, grids = [], []
        for i in range(b):
            real = mask[i]
            ids = input_ids[i][real]
            is_image = torch.zeros(len(ids), dtype=torch.int32)
            prompt_len = int(real[:prompt_width].sum())
            is_image[:prompt_len] = (ids[:prompt_len] == self.vision.image_token_id).int()
            sampled = [t for t in ids[prompt_len:].tolist() if t in self.vision.banned_token_ids]
            if sampled:
                raise ValueError(
                    f"row {i}: its response holds the image token {sampled[0]}, which the model reads as an "
                    "image's place; rlcore's rollouts never sample it (VisionInputs.banned_token_ids): this "
                    "rollout engine does not bias it away, use one that does"
                )
            images = images_of(media[i])
            if images:
                inputs = self.vision.image_inputs(images)
                expected = sum(self.vision.tokens_per_image(inputs["image_grid_thw"]))
                if int(is_image.sum()) != expected:
                    raise ValueError(
                        f"row {i}: its prompt holds {int(is_image.sum())} image tokens, but its {len(images)} "
                        f"images make {expected}; the batch's prompts must be the rollout's expanded prompts"
                    )
                rows, _ = self.rope_index(
                    ids[None], mm_token_type_ids=is_image[None], image_grid_thw=inputs["image_grid_thw"]
                )
                pixels.append(inputs["pixel_values"])
                grids.append(inputs["image_grid_thw"])
                positions[:, i, real] = rows[:, 0].to(torch.long)
            else:
                positions[:, i, real] = torch.arange(len(ids))
            token_types[i, real] = is_image
        if not pixels:
            return positions, {}
        extra = {
            "pixel_values": torch.cat(pixels),
            "image_grid_thw": torch.cat(grids),
            "mm_token_type_ids": token_types,
        }
        return positions, extra


def vision_layout(model_path: str, hf_model: torch.nn.Module) -> VisionLayout | None:
    """The layout for a vision-language model folder (None for a text-only model)."""
    vision = VisionInputs.for_model(model_path)
    if vision is None:
        return None
    backbone = getattr(hf_model, hf_model.base_model_prefix)
    return VisionLayout(vision, backbone.get_rope_index)


#: The attribute that holds a Hugging Face VLM's vision tower: ``model.visual`` (Qwen2.5-VL, Qwen3-VL),
#: ``model.vision_tower`` (LLaVA-style), ``model.vision_model`` (SmolVLM, Idefics3).
VISION_TOWER_NAMES = ("visual", "vision_tower", "vision_model")


def freeze_vision_tower(hf: torch.nn.Module, model_path: str) -> None:
    """Stop gradients to ``hf``'s vision tower (``actor.freeze_vision_tower``): its parameters keep their
    loaded weights and the optimizer never sees them. A model without a vision tower is an error naming
    the key."""
    inner = getattr(hf, "model", hf)
    tower = next((getattr(inner, n) for n in VISION_TOWER_NAMES if hasattr(inner, n)), None)
    if tower is None:
        raise ValueError(
            f"actor.freeze_vision_tower=true, but the model {model_path!r} has no vision tower "
            f"(no {' / '.join(VISION_TOWER_NAMES)} module); set it to false for a text model"
        )
    tower.requires_grad_(False)

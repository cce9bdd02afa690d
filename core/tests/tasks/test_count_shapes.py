"""The built-in visual task ``count_shapes``: its images (written beside the split's file, one shape per
occupied cell, counts balanced), its rows through the dataset (the images decoded, the placeholder made an
image part), its reward, and the warm-up rows with their images expanded as the trainer reads them."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from rlcore.data import DataConfig, DataError, build_val_loader
from rlcore.rewards.functions import reward_function_for
from rlcore.tasks import count_shapes, resolve_files, with_task_recipe

pytest.importorskip("torchvision")  # the Qwen-VL processors' video half needs it (docs/vision.md)


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    from rlcore.testing.tiny_vlm import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("vlm") / "model")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    names = [f"builtin:count_shapes/{s}.jsonl" for s in count_shapes.SPLITS]
    return dict(zip(count_shapes.SPLITS, resolve_files(names, folder), strict=True))


def _occupied_cells(image) -> set[int]:
    """The cells of a 56-pixel image with any non-white pixel, read from the pixels alone."""
    pixels = np.asarray(image)
    cell = count_shapes.CELL
    out = set()
    for c in range(4):
        x, y = (c % 2) * cell, (c // 2) * cell
        if (pixels[y : y + cell, x : x + cell] < 250).any():
            out.add(c)
    return out


@pytest.mark.parametrize(
    ("response", "expected"), [("3", 1.0), (" 3\n", 1.0), ("3.", 0.0), ("33", 0.0), ("", 0.0)]
)
def test_reward_is_the_count_after_stripping_white_space(response, expected):
    assert count_shapes.compute_score(count_shapes.DATA_SOURCE, response, "3") == expected
    assert reward_function_for(count_shapes.DATA_SOURCE) is not None


def test_each_image_shows_as_many_shapes_as_its_answer_in_distinct_cells(files):
    from PIL import Image

    rows = [json.loads(line) for line in open(files["val"])]
    assert len(rows) == count_shapes.SIZES["val"]
    assert Counter(r["reward_model"]["ground_truth"] for r in rows) == {str(k): 32 for k in range(1, 5)}
    for row in rows:
        (name,) = row["images"]
        image = Image.open(files["val"].rsplit("/", 1)[0] + "/" + name)
        assert image.size == (56, 56)
        assert len(_occupied_cells(image)) == int(row["reward_model"]["ground_truth"])


def test_held_out_images_are_not_training_images(files):
    def pixels(split):
        rows = [json.loads(line) for line in open(files[split])]
        base = files[split].rsplit("/", 1)[0]
        return {open(f"{base}/{r['images'][0]}", "rb").read() for r in rows}

    assert not pixels("train") & pixels("val")
    # The warm-up's rows are the training rows with their answers.
    sft = [json.loads(line) for line in open(files["sft"])]
    assert all(r["response"] == r["reward_model"]["ground_truth"] for r in sft)
    assert pixels("sft") == pixels("train")


def test_the_rows_load_with_their_images_and_one_image_token_each(files, vlm):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(vlm)
    dataset = build_val_loader(DataConfig(val_files=[files["val"]], max_prompt_length=32), tokenizer).dataset
    assert len(dataset) == count_shapes.SIZES["val"]  # none dropped for length
    image_token = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for i in (0, 1, len(dataset) - 1):
        sample = dataset[i]
        (image,) = sample["multi_modal_data"]["image"]
        assert image.size == (56, 56)
        assert sample["input_ids"].tolist().count(image_token) == 1


def test_sft_rows_expand_each_image_for_the_trainer(files, vlm):
    from rlcore.trainer.sft import load_sft_examples, sft_batch
    from rlcore.vision import VisionInputs
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(vlm)
    vision = VisionInputs.for_model(vlm)
    examples = load_sft_examples([files["sft"]], tokenizer, max_prompt_length=32, vision=vision)
    assert len(examples) == count_shapes.SIZES["sft"]
    first = examples[0]
    # A 56-pixel image is 4 x 4 patches of 14, merged 2 x 2: four image tokens, the processor says so.
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": count_shapes.QUESTION}]}
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    expected = vision.processor(text=[text], images=first.multi_modal["image"])["input_ids"][0]
    assert first.prompt_ids == expected and first.prompt_ids.count(vision.image_token_id) == 4
    assert tokenizer.decode(first.response_ids[:-1]) == json.loads(open(files["sft"]).readline())["response"]
    batch = sft_batch(examples[:3], tokenizer.pad_token_id)
    assert batch.objects["multi_modal_data"] == [e.multi_modal for e in examples[:3]]
    # A text model cannot take the rows: the error names the row and what to do.
    with pytest.raises(DataError, match=r"sft.jsonl., row 0 .*no vision tower"):
        load_sft_examples([files["sft"]], tokenizer, vision=None)


def test_the_recipe_trains_the_tiny_vlm_on_the_task():
    layer = with_task_recipe({"data": {"train_files": ["builtin:count_shapes/train.jsonl"]}})
    assert layer["model"]["path"] == "builtin:tiny-vlm"
    assert layer["data"]["val_files"] == ["builtin:count_shapes/val.jsonl"]
    assert layer["sft"]["files"] == ["builtin:count_shapes/sft.jsonl"]
    assert layer["trainer"]["warmup_sft_steps"] > 0

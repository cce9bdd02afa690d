"""A row's images read and checked at load time (rlcore.data.images), against Pillow's own decoding, and
the dataset carrying them."""

import io

import numpy as np
import pytest
from PIL import Image
from rlcore.data.files import DataError
from rlcore.data.images import load_images


def _png(colour, size=(6, 4)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def test_paths_bytes_and_dicts_decode_to_the_same_rgb_pixels(tmp_path):
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "red.png").write_bytes(_png((255, 0, 0)))
    Image.new("L", (6, 4), 128).save(tmp_path / "grey.png")  # greyscale: converted to RGB
    images = load_images(
        [
            "img/red.png",
            str(tmp_path / "grey.png"),
            _png((0, 0, 255)),
            {"bytes": _png((0, 255, 0)), "path": None},
            {"path": "img/red.png"},
        ],
        base_dir=str(tmp_path),
        where="row 0",
    )
    pixels = [np.asarray(i) for i in images]
    assert all(i.mode == "RGB" and i.size == (6, 4) for i in images)
    assert (pixels[0] == [255, 0, 0]).all() and (pixels[4] == [255, 0, 0]).all()
    assert (pixels[1] == [128, 128, 128]).all()
    assert (pixels[2] == [0, 0, 255]).all() and (pixels[3] == [0, 255, 0]).all()
    assert load_images(None, base_dir=str(tmp_path), where="row 0") == []


def test_a_missing_file_is_named_with_its_row_and_the_folder_paths_start_at(tmp_path):
    with pytest.raises(
        DataError,
        match=r"file 'd.jsonl', row 3, column 'images', image 1: image file .*nope.png' does not exist",
    ):
        load_images([_png((1, 2, 3)), "nope.png"], base_dir=str(tmp_path), where="file 'd.jsonl', row 3")


def test_truncated_bytes_fail_at_load_not_in_a_rollout(tmp_path):
    broken = _png((9, 9, 9), size=(64, 64))[:60]
    with pytest.raises(
        DataError, match=r"row 2, column 'pics', image 0: its 60 image bytes could not be read"
    ):
        load_images([broken], base_dir=str(tmp_path), where="row 2", key="pics")


def test_a_column_that_is_not_a_list_is_refused(tmp_path):
    with pytest.raises(DataError, match="column 'images': expected a list of images"):
        load_images("a.png", base_dir=str(tmp_path), where="row 0")


def _write_rows(path, rows):
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _row(prompt, images):
    return {
        "prompt": [{"role": "user", "content": prompt}],
        "data_source": "colour",
        "reward_model": {"style": "rule", "ground_truth": "red"},
        "images": images,
    }


def test_the_dataset_carries_each_rows_images_and_one_image_token_per_image(tmp_path):
    from rlcore.data import DataConfig, RLDataset
    from rlcore.testing.tiny_vlm import build_vlm_tokenizer

    tokenizer = build_vlm_tokenizer()
    image_token = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "red.png").write_bytes(_png((255, 0, 0)))
    data = tmp_path / "train.jsonl"
    _write_rows(
        data,
        [
            _row("<image>What colour?", ["pics/red.png"]),
            _row("Compare <image> with <image>.", ["pics/red.png", {"path": "pics/red.png"}]),
            {k: v for k, v in _row("No image here.", []).items() if k != "images"},
        ],
    )
    ds = RLDataset([data], tokenizer, DataConfig())
    counts = [int((ds[i]["input_ids"] == image_token).sum()) for i in range(3)]
    assert counts == [1, 2, 0]
    assert [len(ds[i]["multi_modal_data"]["image"]) for i in range(2)] == [1, 2]
    assert "multi_modal_data" not in ds[2] and "images" not in ds[0]
    assert (np.asarray(ds[1]["multi_modal_data"]["image"][1]) == [255, 0, 0]).all()


def test_the_dataset_names_the_file_and_row_of_a_bad_image(tmp_path):
    from rlcore.data import DataConfig, RLDataset
    from rlcore.testing.tiny_vlm import build_vlm_tokenizer

    data = tmp_path / "train.jsonl"
    (tmp_path / "ok.png").write_bytes(_png((1, 1, 1)))
    _write_rows(data, [_row("<image>?", ["ok.png"]), _row("<image>?", ["gone.png"])])
    with pytest.raises(
        DataError, match=r"train.jsonl', row 1 \(line 2\), column 'images', image 0: image file"
    ):
        RLDataset([data], build_vlm_tokenizer(), DataConfig())
    _write_rows(data, [_row("<image><image>?", ["ok.png"])])
    with pytest.raises(
        DataError, match=r"row 0 \(line 1\): the prompt has 2 image places .* row has 1 images"
    ):
        RLDataset([data], build_vlm_tokenizer(), DataConfig())

"""A row's images read and checked at load time (rlcore.vision.images), against Pillow's own decoding."""

import io

import numpy as np
import pytest
from PIL import Image
from rlcore.data.files import DataError
from rlcore.vision import load_images


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

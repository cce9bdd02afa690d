"""The ``<image>`` placeholder, image parts and the expanded image tokens (rlcore.vision.prompts)."""

import pytest
from rlcore.data.files import DataError
from rlcore.vision import expand_image_tokens, image_parts


def test_placeholders_become_image_parts_in_order():
    messages = [
        {"role": "system", "content": "Count."},
        {"role": "user", "content": "Left <image> and right <image>: which is larger?"},
    ]
    out = image_parts(messages, 2, "row 0")
    assert out[0] == {"role": "system", "content": [{"type": "text", "text": "Count."}]}
    assert out[1]["content"] == [
        {"type": "text", "text": "Left "},
        {"type": "image"},
        {"type": "text", "text": " and right "},
        {"type": "image"},
        {"type": "text", "text": ": which is larger?"},
    ]
    assert messages[1]["content"].startswith("Left <image>"), "the row's own messages are not changed"


def test_parts_given_as_parts_are_kept_and_counted():
    parts = [{"type": "image"}, {"type": "text", "text": "Colour?"}]
    assert image_parts([{"role": "user", "content": parts}], 1, "row 0")[0]["content"] == parts


@pytest.mark.parametrize(
    ("text", "images"), [("<image><image>How many?", 1), ("How many?", 1), ("<image>?", 0)]
)
def test_places_and_images_must_agree(text, images):
    with pytest.raises(
        DataError, match=r"file 'x.jsonl', row 4: the prompt has \d image places .* row has \d images"
    ):
        image_parts([{"role": "user", "content": text}], images, "file 'x.jsonl', row 4")


def test_expansion_repeats_each_image_token_by_its_own_count():
    assert expand_image_tokens([5, 9, 6, 9, 7], image_token_id=9, counts=[1, 4]) == [5, 9, 6, 9, 9, 9, 9, 7]
    assert expand_image_tokens([5, 6], image_token_id=9, counts=[]) == [5, 6]


def test_an_already_expanded_prompt_is_refused():
    with pytest.raises(
        ValueError, match="holds the image token 9 3 times, for 1 images; was it expanded already"
    ):
        expand_image_tokens([9, 9, 9], image_token_id=9, counts=[3])

"""Batch.concat against merged layouts written out by hand."""

import pytest
import torch
from rlcore.api import Batch

PAD = 50  # not 0, so a field padded with 0 where the pad id belongs shows


def long(rows):
    return torch.tensor(rows, dtype=torch.long)


def test_concat_keeps_prompts_left_and_responses_right_at_column_p():
    # P=2, R=3: prompts [5, 6] and [4], responses [7, 8, 9] and [3].
    first = Batch(
        {
            "prompts": long([[5, 6], [PAD, 4]]),
            "responses": long([[7, 8, 9], [3, PAD, PAD]]),
            "input_ids": long([[5, 6, 7, 8, 9], [PAD, 4, 3, PAD, PAD]]),
            "attention_mask": long([[1, 1, 1, 1, 1], [0, 1, 1, 0, 0]]),
            "position_ids": long([[0, 1, 2, 3, 4], [0, 0, 1, 1, 1]]),
            "response_mask": long([[1, 1, 1], [1, 0, 0]]),
            "old_log_probs": torch.tensor([[-0.1, -0.2, -0.3], [-0.5, 0.0, 0.0]]),
            "reward_baselines": torch.tensor([1.0, 2.0]),
        },
        {"uid": ["a", "b"]},
        {"pad_token_id": PAD},
    )
    # P=4, R=2: prompt [1, 2, 3, 4], response [9, 8].
    second = Batch(
        {
            "prompts": long([[1, 2, 3, 4]]),
            "responses": long([[9, 8]]),
            "input_ids": long([[1, 2, 3, 4, 9, 8]]),
            "attention_mask": long([[1, 1, 1, 1, 1, 1]]),
            "position_ids": long([[0, 1, 2, 3, 4, 5]]),
            "response_mask": long([[1, 1]]),
            "old_log_probs": torch.tensor([[-0.7, -0.8]]),
            "reward_baselines": torch.tensor([3.0]),
        },
        {"uid": ["c"]},
        {"pad_token_id": PAD},
    )
    merged = Batch.concat([first, second])

    # Merged: P=4, R=3; every response starts at column 4.
    expected = {
        "prompts": long([[PAD, PAD, 5, 6], [PAD, PAD, PAD, 4], [1, 2, 3, 4]]),
        "responses": long([[7, 8, 9], [3, PAD, PAD], [9, 8, PAD]]),
        "input_ids": long(
            [
                [PAD, PAD, 5, 6, 7, 8, 9],
                [PAD, PAD, PAD, 4, 3, PAD, PAD],
                [1, 2, 3, 4, 9, 8, PAD],
            ]
        ),
        "attention_mask": long([[0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 0]]),
        "position_ids": long([[0, 0, 0, 1, 2, 3, 4], [0, 0, 0, 0, 1, 1, 1], [0, 1, 2, 3, 4, 5, 5]]),
        "response_mask": long([[1, 1, 1], [1, 0, 0], [1, 1, 0]]),
        "old_log_probs": torch.tensor([[-0.1, -0.2, -0.3], [-0.5, 0.0, 0.0], [-0.7, -0.8, 0.0]]),
        "reward_baselines": torch.tensor([1.0, 2.0, 3.0]),
    }
    assert sorted(merged.tensors) == sorted(expected)
    for key, want in expected.items():
        assert merged[key].dtype == want.dtype, key
        assert torch.equal(merged[key], want), key
    assert merged["uid"] == ["a", "b", "c"]
    assert merged.meta == {"pad_token_id": PAD}


def test_concat_of_prompt_batches_left_pads_them():
    # A batch of prompts only (the loader's layout): no responses, so R=0 and [B, P] fields pad left.
    short = Batch(
        {"prompts": long([[7]]), "prompt_mask": long([[1]]), "attention_mask": long([[1]])},
        meta={"pad_token_id": PAD},
    )
    wide = Batch(
        {
            "prompts": long([[PAD, 8, 9]]),
            "prompt_mask": long([[0, 1, 1]]),
            "attention_mask": long([[0, 1, 1]]),
        },
        meta={"pad_token_id": PAD},
    )
    merged = Batch.concat([short, wide])
    assert merged["prompts"].tolist() == [[PAD, PAD, 7], [PAD, 8, 9]]
    assert merged["prompt_mask"].tolist() == [[0, 0, 1], [0, 1, 1]]
    assert merged["attention_mask"].tolist() == [[0, 0, 1], [0, 1, 1]]


def test_concat_pads_token_fields_only_with_a_declared_pad_id():
    def batch(width, pad_token_id):
        meta = {} if pad_token_id is None else {"pad_token_id": pad_token_id}
        return Batch({"responses": torch.ones(1, width, dtype=torch.long)}, meta=meta)

    with pytest.raises(
        ValueError, match=r"padding 'responses' needs one meta\['pad_token_id'\].*\[0, None\]"
    ):
        Batch.concat([batch(1, 0), batch(2, None)])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        Batch.concat([batch(1, 0), batch(2, 1)])
    # Equal widths need no padding, hence no pad id.
    assert Batch.concat([batch(2, None), batch(2, None)])["responses"].shape == (2, 2)


def test_pinnable_makes_an_expanded_tensor_dense_with_the_same_values():
    # An expanded position row (the VLM's 3-row mrope positions) has stride 0 on dim 0; pin_memory refuses
    # it ("more than one element of the written-to tensor refers to a single memory location"), so the
    # pinned path copies it dense first. Dense tensors pass through untouched (no extra copy).
    from rlcore.api.batch import pinnable

    positions = torch.arange(6).view(1, 1, 6).expand(3, 2, 6)
    dense = pinnable(positions)
    assert dense.is_contiguous() and 0 not in dense.stride()
    assert torch.equal(dense, torch.arange(6).repeat(3, 2, 1))
    ids = torch.arange(12).view(2, 6)
    assert pinnable(ids) is ids


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_to_device_pins_an_expanded_tensor():
    from rlcore.api.batch import to_device

    positions = torch.arange(6).view(1, 1, 6).expand(3, 2, 6)
    moved = to_device(positions, "cuda", pin=True)
    assert torch.equal(moved.cpu(), positions)

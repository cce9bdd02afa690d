"""completions_to_batch against layouts written out by hand."""

import pytest
import torch
from rlcore.api import Batch, Completion
from rlcore.rollout.batching import completions_to_batch

PAD = 0


def completion(prompt, response, log_probs=None, text="", reason="stop"):
    return Completion(
        prompt_ids=prompt, token_ids=response, log_probs=log_probs, finish_reason=reason, text=text
    )


def test_layout_by_hand():
    groups = [
        [completion([5, 6], [7, 8, 9], [-0.1, -0.2, -0.3], "x"), completion([5, 6], [7], [-0.5], "y")],
        [
            completion([4, 3, 2], [1, 1], [-1.0, -2.0], "z", "length"),
            completion([4, 3, 2], [8, 8], [-3.0, -4.0]),
        ],
    ]
    batch = completions_to_batch(groups, PAD)
    assert isinstance(batch, Batch) and len(batch) == 4
    assert batch["prompts"].tolist() == [[0, 5, 6], [0, 5, 6], [4, 3, 2], [4, 3, 2]]
    assert batch["responses"].tolist() == [[7, 8, 9], [7, 0, 0], [1, 1, 0], [8, 8, 0]]
    assert batch["input_ids"].tolist() == [
        [0, 5, 6, 7, 8, 9],
        [0, 5, 6, 7, 0, 0],
        [4, 3, 2, 1, 1, 0],
        [4, 3, 2, 8, 8, 0],
    ]
    assert batch["attention_mask"].tolist() == [
        [0, 1, 1, 1, 1, 1],
        [0, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1, 0],
    ]
    assert batch["position_ids"].tolist() == [
        [0, 0, 1, 2, 3, 4],
        [0, 0, 1, 2, 2, 2],
        [0, 1, 2, 3, 4, 4],
        [0, 1, 2, 3, 4, 4],
    ]
    assert batch["response_mask"].tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 0]]
    want = torch.tensor([[-0.1, -0.2, -0.3], [-0.5, 0, 0], [-1.0, -2.0, 0], [-3.0, -4.0, 0]])
    assert torch.equal(batch["rollout_log_probs"], want)
    assert batch["rollout_log_probs"].dtype == torch.float32
    assert all(
        batch[k].dtype == torch.long for k in ("prompts", "input_ids", "attention_mask", "response_mask")
    )
    assert batch["response_text"] == ["x", "y", "z", ""]
    assert batch["finish_reason"] == ["stop", "stop", "length", "stop"]


def test_flat_list_fixed_widths_and_no_log_probs():
    batch = completions_to_batch(
        [completion([3], [4]), completion([2, 3], [])], pad_token_id=-1, prompt_length=3, response_length=2
    )
    assert batch["prompts"].tolist() == [[-1, -1, 3], [-1, 2, 3]]
    assert batch["responses"].tolist() == [[4, -1], [-1, -1]]
    assert batch["response_mask"].tolist() == [[1, 0], [0, 0]]
    assert batch["position_ids"].tolist() == [[0, 0, 0, 1, 1], [0, 0, 1, 1, 1]]
    assert "rollout_log_probs" not in batch


def test_errors_name_the_row():
    with pytest.raises(ValueError, match="row 1 has a response of 3 tokens, longer than response_length=2"):
        completions_to_batch([completion([1], [1]), completion([1], [1, 2, 3])], PAD, response_length=2)
    with pytest.raises(ValueError, match="row 0 has log-probs but row 1 lacks them"):
        completions_to_batch([completion([1], [1], [-1.0]), completion([1], [1])], PAD)
    with pytest.raises(ValueError, match="row 0 has 2 response tokens but 1 log-probs"):
        completions_to_batch([completion([1], [1, 2], [-1.0])], PAD)
    with pytest.raises(TypeError, match="item 0 is a str"):
        completions_to_batch(["oops"], PAD)
    with pytest.raises(ValueError, match="no completions"):
        completions_to_batch([], PAD)


def test_generation_batches_of_different_widths_concat_into_the_layout_of_one():
    # DAPO merges generation rounds whose prompt and response widths differ.
    first = [completion([5, 6], [7, 8, 9], [-0.1, -0.2, -0.3]), completion([4], [3], [-0.5])]
    second = [completion([1, 2, 3, 4], [9, 9], [-0.7, -0.8])]
    merged = Batch.concat([completions_to_batch(c, pad_token_id=-1) for c in (first, second)])
    expected = completions_to_batch(first + second, pad_token_id=-1)
    assert sorted(merged.tensors) == sorted(expected.tensors)
    for key in expected.tensors:
        assert torch.equal(merged[key], expected[key]), key
    assert merged.meta == expected.meta == {"pad_token_id": -1}

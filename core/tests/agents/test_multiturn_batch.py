"""Multi-turn completions in the batch layout, and sequence scores on the last model token."""

import pytest
import torch
from rlcore.api import Completion, place_sequence_scores
from rlcore.rollout.batching import completions_to_batch

PAD = 0


def test_interleaved_mask_by_hand():
    c1 = Completion(
        [5, 6], [7, 8, 30, 31, 9, 2], [-0.1, -0.2, -9.0, -9.0, -0.3, -0.4], "stop", "x", [1, 1, 0, 0, 1, 1]
    )
    c2 = Completion([4], [7, 2], [-0.5, -0.6], "stop", "y")  # single turn: no mask given
    batch = completions_to_batch([c1, c2], PAD)
    assert batch["responses"].tolist() == [[7, 8, 30, 31, 9, 2], [7, 2, 0, 0, 0, 0]]
    assert batch["response_mask"].tolist() == [[1, 1, 0, 0, 1, 1], [1, 1, 0, 0, 0, 0]]
    # The model reads observation tokens: they are attended to and have positions.
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0, 0, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5, 6, 7], [0, 0, 1, 2, 2, 2, 2, 2]]
    # Log-probs of observation tokens are zeroed whatever the completion carried.
    assert batch["rollout_log_probs"][0].tolist() == pytest.approx([-0.1, -0.2, 0.0, 0.0, -0.3, -0.4])
    assert "agent_info" not in batch.objects


def test_agent_info_travels_as_an_object():
    c = Completion([5], [7], [-0.1], "stop", "", [1], {"turns": 1})
    plain = Completion([5], [8], [-0.2], "stop", "")
    batch = completions_to_batch([c, plain], PAD)
    assert batch["agent_info"] == [{"turns": 1}, {}]


@pytest.mark.parametrize("mask", [[1, 0], [1, 2, 1], [1, 1, 1, 1]])
def test_bad_masks_name_the_row(mask):
    c = Completion([5], [7, 8, 9], [-0.1, -0.2, -0.3], "stop", "", mask)
    with pytest.raises(ValueError, match="row 1 has 3 response tokens but its response_mask"):
        completions_to_batch([Completion([5], [7], [-0.1], "stop"), c], PAD)


def test_sequence_score_sits_on_the_last_model_token():
    mask = torch.tensor(
        [
            [1, 1, 0, 0, 1, 1, 0, 1],
            [1, 1, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0],
            [0] * 8,
            [1, 0, 0, 0, 1, 1, 0, 0],
        ]
    )
    out = place_sequence_scores([1.0, 2.0, 3.0, 4.0, 5.0], mask)
    expected = torch.zeros(5, 8)
    # The last index where the mask is 1; a row without one gets nothing. (mask.sum() - 1 would put
    # row 0's score on index 4 and row 4's on index 2, both observation tokens.)
    for row, (col, value) in enumerate([(7, 1.0), (1, 2.0), (2, 3.0), (None, 4.0), (5, 5.0)]):
        if col is not None:
            expected[row, col] = value
    assert torch.equal(out, expected)
    assert place_sequence_scores([1.0], torch.zeros(1, 0, dtype=torch.long)).shape == (1, 0)


def test_step_metrics_count_tool_tokens_apart():
    from rlcore.telemetry.metrics import batch_metrics

    c1 = Completion([5, 6], [7, 8, 30, 31, 9, 2], [-0.1] * 6, "stop", "", [1, 1, 0, 0, 1, 1])
    c2 = Completion([4, 4, 4], [7, 2], [-0.5, -0.6], "stop", "")
    batch = completions_to_batch([c1, c2], PAD)
    m = batch_metrics(batch, max_response_length=6)
    assert m["response_length/mean"] == 3.0  # model tokens: 4 and 2
    assert m["prompt_length/mean"] == 2.5  # 2 and 3, not 4 and 3
    assert m["response_length/clip_ratio"] == 0.5  # the episode used its 6-token budget
    assert m["tokens/total"] == 13.0 and m["tokens/response"] == 6.0

"""Micro-batch planning, rank equalisation, model-input layout and the LR schedule (no engine)."""

import math

import pytest
import torch
from rlcore.api import Batch
from rlcore.kernels.micro_batches import plan_micro_batches
from rlcore_fsdp.micro_batches import MicroBatch, build_inputs, equalize, token_costs
from rlcore_fsdp.schedule import check_schedule, lr_factor


def test_fixed_size_micro_batches_are_consecutive_rows():
    assert plan_micro_batches([9] * 5, 2, None) == [[0, 1], [2, 3], [4]]


def test_token_budget_packs_longest_first_without_exceeding_it():
    costs = [5, 9, 3, 7, 2]
    # First-fit decreasing by hand, budget 12: row 1 (9) opens A; row 3 (7) opens B; row 0 (5) joins B
    # (12); row 2 (3) joins A (12); row 4 (2) fits nowhere and opens C.
    assert plan_micro_batches(costs, 1, 12, balance=False) == [[1, 2], [0, 3], [4]]
    with pytest.raises(ValueError, match=r"row 1 needs 9 tokens.*max_tokens_per_micro_batch=8"):
        plan_micro_batches(costs, 1, 8)


def test_token_budget_balances_loads_over_the_first_fit_count():
    costs = [5, 9, 3, 7, 2]
    # Three micro-batches as first-fit needs; longest first into the least loaded, by hand: 9 -> A,
    # 7 -> B, 5 -> C, 3 -> C (5 < 7 < 9), 2 -> B (7 < 8 < 9). Loads 9, 9, 8 instead of 12, 12, 2.
    assert plan_micro_batches(costs, 1, 12) == [[1], [3, 4], [0, 2]]
    # Where the greedy spread would overflow a micro-batch, first-fit's packing stays: budget 10 fits
    # {6, 4} and {4, 3, 3}; the spread gives 6 -> A, 4 -> B, 4 -> B, 3 -> A, then 3 -> B = 11 > 10.
    assert plan_micro_batches([6, 4, 4, 3, 3], 1, 10) == [[0, 1], [2, 3, 4]]


def test_token_budget_on_rl_lengths_leaves_no_runt_micro_batch():
    g = torch.Generator().manual_seed(2)
    costs = torch.randint(128, 1025, (150,), generator=g).tolist()  # 82,283 tokens: 5.02 budgets
    budget = 16384
    first_fit = plan_micro_batches(costs, 1, budget, balance=False)
    balanced = plan_micro_batches(costs, 1, budget)
    assert len(balanced) == len(first_fit) == math.ceil(sum(costs) / budget)
    assert sorted(i for b in balanced for i in b) == list(range(len(costs)))
    loads = [sum(costs[i] for i in b) for b in balanced]
    assert max(loads) <= budget
    assert max(loads) - min(loads) <= max(costs)
    # What balancing is for: first-fit's last micro-batch is a runt (704 tokens).
    assert min(sum(costs[i] for i in b) for b in first_fit) < 1000


def test_equalize_splits_then_adds_dummies():
    assert equalize([[0, 1, 2], [3]], 3) == [MicroBatch((0,)), MicroBatch((1, 2)), MicroBatch((3,))]
    out = equalize([[0]], 3)
    assert out == [MicroBatch((0,)), MicroBatch((0,), dummy=True), MicroBatch((0,), dummy=True)]
    with pytest.raises(ValueError, match="empty batch"):
        equalize([], 1)


def layout_batch() -> Batch:
    """Two rows, prompt width 3 (left-padded), response width 2 (right-padded)."""
    input_ids = torch.tensor([[0, 11, 12, 13, 14], [21, 22, 23, 24, 0]])
    mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    tensors = {
        "input_ids": input_ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
        "responses": input_ids[:, 3:],
    }
    return Batch(tensors)


def test_padded_layout_reads_the_position_before_each_response_token():
    inputs = build_inputs(layout_batch(), "lm", packed=False)
    # Row 0: response tokens 13, 14 at columns 3, 4 are predicted from flat 2, 3; row 1: 24 from 5 + 2.
    assert inputs.index.tolist() == [2, 3, 7]
    assert inputs.targets.tolist() == [13, 14, 24]
    assert inputs.response_valid.tolist() == [[True, True], [True, False]]
    assert inputs.attention_mask is not None and inputs.input_ids.shape == (2, 5)


def test_padded_layout_cuts_columns_that_are_padding_in_every_row():
    data = layout_batch()
    data.tensors["attention_mask"] = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 0]])
    data.tensors["position_ids"] = torch.tensor([[0, 0, 1, 2, 0], [0, 0, 0, 1, 0]])
    inputs = build_inputs(data, "lm", packed=False)
    assert inputs.input_ids.tolist() == [[11, 12, 13], [22, 23, 24]]
    assert inputs.attention_mask.tolist() == [[1, 1, 1], [0, 1, 1]]
    # Response column 3 (token 13 / 24) is predicted from column 2, i.e. trimmed column 1 of each row.
    assert inputs.index.tolist() == [1, 4]
    assert inputs.targets.tolist() == [13, 24]


def test_packed_layout_drops_padding_and_restarts_positions():
    inputs = build_inputs(layout_batch(), "lm", packed=True)
    assert inputs.input_ids.tolist() == [[11, 12, 13, 14, 21, 22, 23, 24]]
    assert inputs.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]]
    assert inputs.attention_mask is None
    assert inputs.index.tolist() == [1, 2, 6]
    assert inputs.targets.tolist() == [13, 14, 24]


def test_score_head_reads_the_last_real_token_and_anchor_is_first_real_token():
    padded = build_inputs(layout_batch(), "score", packed=False, anchor=True)
    assert padded.index.tolist() == [4, 8, 1]  # last real tokens, then the anchor
    packed = build_inputs(layout_batch(), "score", packed=True)
    assert packed.index.tolist() == [3, 7]


def test_token_costs():
    assert token_costs(layout_batch(), packed=True) == [4, 4]
    assert token_costs(layout_batch(), packed=False) == [5, 5]


def test_layout_errors_name_the_row():
    bad = layout_batch()
    bad.tensors["position_ids"] = bad["position_ids"] + 1
    with pytest.raises(ValueError, match="row 0 has \\[1, 2, 3, 4\\]"):
        build_inputs(bad, "lm", packed=True)
    hole = layout_batch()
    hole.tensors["attention_mask"] = torch.tensor([[0, 1, 1, 0, 1], [1, 1, 1, 1, 0]])
    with pytest.raises(ValueError, match="row 0: response token 1 follows a padding position"):
        build_inputs(hole, "lm", packed=False)
    missing = Batch({k: v for k, v in layout_batch().tensors.items() if k != "responses"})
    with pytest.raises(KeyError, match="needs batch tensor 'responses'"):
        build_inputs(missing, "lm", packed=False)


def test_lr_schedule_by_hand():
    # warm-up 2 steps, cosine to 10% over steps 2..6
    factors = [lr_factor(s, "cosine", 2, 6, 0.1) for s in range(8)]
    cos = [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)) for p in (0, 0.25, 0.5, 0.75, 1.0, 1.0)]
    assert factors == pytest.approx([0.5, 1.0, *cos])
    assert factors[4] == pytest.approx(0.55)
    assert [lr_factor(s, "constant", 3, 0, 0.0) for s in range(5)] == pytest.approx([1 / 3, 2 / 3, 1, 1, 1])


def test_schedule_errors():
    with pytest.raises(ValueError, match="total_steps \\(2\\) must exceed warmup_steps \\(2\\)"):
        check_schedule("cosine", 2, 2, 0.0)
    with pytest.raises(ValueError, match="lr_schedule must be one of"):
        check_schedule("linear", 0, 10, 0.0)

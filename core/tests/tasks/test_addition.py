"""The built-in task ``addition``: its reward on the answers a model gives, and its fixed, disjoint splits."""

import pytest
from rlcore.tasks import addition, parse_builtin, with_task_recipe


@pytest.mark.parametrize(
    "response, score",
    [
        ("19", 1.0),
        ("7 + 12 = 19", 1.0),
        ("The answer is 19.", 1.0),
        ("19 is wrong, it is 20", 0.0),
        ("To add 7 and 12, we need to", 0.0),  # cut before the sum: the last number is an operand
        ("", 0.0),
        ("-19", 0.0),
    ],
)
def test_the_last_integer_must_be_the_sum(response, score):
    assert addition.compute_score(addition.DATA_SOURCE, response, "19") == score


def test_splits_are_fixed_disjoint_and_cover_every_problem():
    train, val = addition.problems("train"), addition.problems("val")
    assert len(val) == addition.VAL_SIZE == 200 and len(train) == 441 - 200
    assert not set(train) & set(val)
    assert set(train) | set(val) == {(a, b) for a in range(21) for b in range(21)}
    assert addition.problems("val") == val  # a pure function of the split
    row = addition.rows("val")[0]
    a, b = row["extra_info"]["a"], row["extra_info"]["b"]
    assert row["prompt"] == [{"role": "user", "content": f"What is {a} + {b}?"}]
    assert row["reward_model"]["ground_truth"] == str(a + b)
    with pytest.raises(ValueError, match="no split 'sft'"):
        addition.rows("sft")


def test_the_recipe_trains_the_real_model():
    assert parse_builtin("builtin:addition/val.jsonl") == ("addition", "val")
    raw = with_task_recipe({"data": {"train_files": ["builtin:addition/train.jsonl"]}})
    assert raw["model"]["path"] == "builtin:smollm2-135m-instruct"
    assert raw["data"]["val_files"] == ["builtin:addition/val.jsonl"]
    assert "sft" not in raw  # no warm-up: the pretrained model already answers

"""GSM8K rule scorer on hand-written responses (verl's strict/flexible semantics)."""

from __future__ import annotations

import pytest
from rlcore.rewards.gsm8k import compute_score, extract_answer

DS = "openai/gsm8k"


@pytest.mark.parametrize(
    "response, truth, expected",
    [
        ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "72", 1.0),
        ("#### 1,234", "1234", 1.0),  # thousands separators are dropped
        ("#### -5", "-5", 1.0),
        ("first guess #### 3, on reflection #### 4", "4", 1.0),  # the last marked answer counts
        ("first guess #### 3, on reflection #### 4", "3", 0.0),
        ("#### 71", "72", 0.0),  # wrong
        ("The answer is 72", "72", 0.0),  # right number, no #### format
        ("####72", "72", 0.0),  # the format needs the space
        ("#### $72", "72", 0.0),
        ("", "72", 0.0),
        ("#### 72" + " and more words" * 30, "72", 0.0),  # only the last 300 characters are searched
    ],
)
def test_strict(response, truth, expected):
    assert compute_score(DS, response, truth) == expected


def test_format_score_only_when_an_answer_was_found():
    assert compute_score(DS, "#### 71", "72", format_score=0.1) == 0.1
    assert compute_score(DS, "no answer here", "72", format_score=0.1) == 0.0
    assert compute_score(DS, "#### 72", "72", format_score=0.1, score=2.0) == 2.0


@pytest.mark.parametrize(
    "response, truth, expected",
    [
        ("So she has 72 apples", "72", 1.0),
        ("3 apples, then 72 apples", "72", 1.0),  # the last number counts
        ("#### 72", "72", 1.0),
        ("so 1,234 in total", "1,234", 1.0),  # flexible keeps the commas, as verl does
        ("no numbers at all", "72", 0.0),
    ],
)
def test_flexible(response, truth, expected):
    assert compute_score(DS, response, truth, method="flexible") == expected


def test_extract_answer():
    assert extract_answer("x #### 1,000,000") == "1000000"
    assert extract_answer("nothing") is None
    assert extract_answer("end. . .", method="flexible") is None
    with pytest.raises(ValueError, match="'strict' or 'flexible'"):
        extract_answer("#### 1", method="loose")


def test_integer_ground_truth_is_compared_as_text():
    assert compute_score(DS, "#### 72", 72) == 1.0

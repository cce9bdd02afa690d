"""MATH rule scorer: last boxed answer and normalised comparison, on hand-written cases."""

from __future__ import annotations

import pytest
from rlcore.rewards.math_reward import compute_score, is_equiv, last_boxed, normalize, unbox

DS = "lighteval/MATH"


@pytest.mark.parametrize(
    "response, truth, expected",
    [
        ("So the answer is $\\boxed{5}$.", "5", 1.0),
        ("$\\boxed{6}$", "5", 0.0),
        ("no box, the answer is 5", "5", 0.0),
        ("\\boxed{5", "5", 0.0),  # unbalanced braces
        ("first \\boxed{3}, finally \\boxed{4}", "4", 1.0),
        ("first \\boxed{3}, finally \\boxed{4}", "3", 0.0),
        ("$\\boxed{\\frac{1}{2}}$", "\\frac{1}{2}", 1.0),
        ("$\\boxed{\\dfrac{1}{2}}$", "\\frac12", 1.0),
        ("$\\boxed{0.5}$", "\\frac{1}{2}", 1.0),
        ("$\\boxed{.5}$", "\\frac{1}{2}", 1.0),
        ("$\\boxed{1/2}$", "\\frac{1}{2}", 1.0),
        ("$\\boxed{\\left( 1, 2 \\right)}$", "(1,2)", 1.0),
        ("$\\boxed{30^\\circ}$", "30", 1.0),
        ("$\\boxed{10 \\text{ cm}}$", "10", 1.0),
        ("$\\boxed{50\\%}$", "50", 1.0),
        ("$\\boxed{x = 5}$", "5", 1.0),
        ("$\\boxed{2\\sqrt3}$", "2\\sqrt{3}", 1.0),
        ("$\\boxed{\\tfrac{3}{4}}$", "\\frac{3}{4}", 1.0),
        ("the answer is \\boxed 7$ done", "7", 1.0),
        ("\\fbox{9}", "9", 1.0),
        ("$\\boxed{\\frac{1}{3}}$", "\\frac{1}{2}", 0.0),
    ],
)
def test_compute_score(response, truth, expected):
    assert compute_score(DS, response, truth) == expected


def test_last_boxed_and_unbox():
    assert last_boxed("a \\boxed{x^{2}} b") == "\\boxed{x^{2}}"
    assert last_boxed("nothing") is None
    assert unbox("\\boxed{x^{2}}") == "x^{2}"
    assert unbox("\\boxed 7") == "7"
    assert unbox("\\boxedx") is None


@pytest.mark.parametrize(
    "raw, canonical",
    [
        ("\\frac12", "\\frac{1}{2}"),
        ("\\frac1{72}", "\\frac{1}{72}"),
        ("3/4", "\\frac{3}{4}"),
        ("03/4", "03/4"),  # not the plain form of two integers
        ("\\sqrt2+1", "\\sqrt{2}+1"),
        ("k = 7", "7"),
        ("\\left[ 0, 1 \\right)", "[0,1)"),
        ("\\$ 5", "5"),
        ("", ""),
    ],
)
def test_normalize(raw, canonical):
    assert normalize(raw) == canonical


def test_unparsable_answers_compare_as_text():
    # "\sqrt" with no argument cannot be normalised; the raw strings are compared instead.
    assert is_equiv("\\sqrt", "\\sqrt")
    assert not is_equiv("\\sqrt", "\\sqrt{2}")
    assert is_equiv(None, None)
    assert not is_equiv("1", None)

"""The code reward on hand-written solutions: correct, partly wrong, crashing, looping, malicious and
reward-hacking ones; through the registry and the rule provider's worker processes too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlcore.rewards import RewardConfig, reward_function_for
from rlcore.rewards.code import compute_score, extract_code, outputs_match, parse_tests
from rlcore.rewards.rule_provider import RuleRewardProvider

ADD_TESTS = {"inputs": ["2 3\n", "10 -4\n", "0 0\n", "100 200\n"], "outputs": ["5\n", "6\n", "0\n", "300\n"]}
SQUARE_ASSERTS = ["assert square(3) == 9", "assert square(-2) == 4", "assert square(0) == 0"]


def fenced(code: str, prose: str = "Here is my solution.") -> str:
    return f"{prose}\n```python\n{code}\n```\nDone."


def test_extract_code_takes_the_last_python_block():
    text = "```python\nfirst()\n```\nthen\n```cpp\nint main(){}\n```\n```py\nsecond()\n```\ntrailing"
    assert extract_code(text) == "second()\n"
    assert extract_code("```\nplain()\n```") == "plain()\n"
    assert extract_code("```cpp\nint main(){}\n```") is None
    assert extract_code("no code at all") is None


def test_parse_tests_formats():
    assert len(parse_tests(json.dumps(ADD_TESTS))) == 4
    assert parse_tests({"asserts": SQUARE_ASSERTS})[1].test_code == "assert square(-2) == 4"
    assert len(parse_tests(SQUARE_ASSERTS)) == 3
    assert parse_tests("assert f() == 1")[0].test_code == "assert f() == 1"
    assert parse_tests({"inputs": [["1", "2"]], "outputs": [["3"]]})[0].stdin == "1\n2\n"
    with pytest.raises(ValueError, match="3 inputs but 1 outputs"):
        parse_tests({"inputs": [1, 2, 3], "outputs": [1]})
    calls = parse_tests({"inputs": [[1, 2], "[3, 4]"], "outputs": [3, [7]], "fn_name": "add"})
    assert [(c.fn_name, c.args, c.value) for c in calls] == [("add", [1, 2], 3), ("add", [3, 4], [7])]
    with pytest.raises(ValueError, match="must be"):
        parse_tests({"nothing": 1})


def test_outputs_match_tokens_and_numbers():
    assert outputs_match("5 \n6\n\n", "5\n6")
    assert outputs_match("0.3333333", "0.33333333")
    assert not outputs_match("0.34", "0.33")
    assert not outputs_match("5 6", "5")
    assert not outputs_match("yes", "YES")


def test_correct_solution_scores_one():
    solution = fenced("a, b = map(int, input().split())\nprint(a + b)")
    score = compute_score("code", solution, ADD_TESTS)
    assert score == {
        "score": 1.0,
        "passed": 4.0,
        "total": 4.0,
        "timeouts": 0.0,
        "errors": 0.0,
        "no_code": 0.0,
    }


def test_wrong_solution_scores_the_pass_fraction():
    # a - b is right only where b == 0 ... and multiplying is right for 0 0 only: 1 of 4.
    assert (
        compute_score("code", fenced("a, b = map(int, input().split())\nprint(a * b)"), ADD_TESTS)["score"]
        == 0.25
    )
    partly = fenced("a, b = map(int, input().split())\nprint(a + b if a < 50 else 0)")
    assert compute_score("code", partly, ADD_TESTS)["score"] == 0.75


def test_assert_tests():
    right = fenced("def square(x):\n    return x * x")
    assert compute_score("code", right, {"asserts": SQUARE_ASSERTS})["score"] == 1.0
    # 3 * |x| is right for 3 (9) and 0 (0), wrong for -2 (6): 2 of 3.
    wrong = fenced("def square(x):\n    return abs(x) * 3")
    assert compute_score("code", wrong, SQUARE_ASSERTS)["score"] == pytest.approx(2 / 3)
    program = "assert square(2) == 4\nassert square(5) == 25\n"
    assert compute_score("code", right, {"test_code": program})["score"] == 1.0


def test_exiting_early_does_not_pass_assert_tests():
    """A known reward hack: exit(0) before the asserts run."""
    for hack in ("import sys\nsys.exit(0)", "import os\nos._exit(0)", "raise SystemExit"):
        assert compute_score("code", fenced(hack), SQUARE_ASSERTS)["score"] == 0.0, hack


def test_no_code_scores_zero():
    assert compute_score("code", "I think the answer is 5.", ADD_TESTS) == {
        "score": 0.0,
        "passed": 0.0,
        "total": 4.0,
        "timeouts": 0.0,
        "errors": 0.0,
        "no_code": 1.0,
    }


def test_crashing_solution_scores_zero():
    score = compute_score("code", fenced("raise RuntimeError('boom')"), ADD_TESTS)
    assert score["score"] == 0.0 and score["errors"] == 4.0


def test_looping_solution_scores_zero_within_the_budget():
    import time

    start = time.monotonic()
    score = compute_score(
        "code", fenced("while True:\n    pass"), ADD_TESTS, timeout_s=1.0, time_budget_s=6.0
    )
    assert score["score"] == 0.0 and score["timeouts"] == 4.0
    assert time.monotonic() - start < 9.0


def test_time_budget_fails_the_tests_still_running():
    import time

    start = time.monotonic()
    score = compute_score(
        "code", fenced("import time\ntime.sleep(30)"), ADD_TESTS, timeout_s=20, time_budget_s=1.5
    )
    assert score["score"] == 0.0 and score["timeouts"] == 4.0
    assert time.monotonic() - start < 5.0


@pytest.mark.parametrize(
    "malicious",
    [
        "import os\nwhile True:\n    os.fork()",
        "x = bytearray(10 * 2**30)",
        "import socket\nsocket.create_connection(('pypi.org', 443))",
        "open('/tmp/rlcore-code-reward-pwned', 'w').write('x')",
        "import os\nos.kill(os.getppid(), 9)",
    ],
    ids=["fork-bomb", "memory", "network", "write-outside", "kill-parent"],
)
def test_malicious_solution_scores_zero_and_harms_nothing(malicious):
    score = compute_score("code", fenced(malicious), ADD_TESTS, timeout_s=1.0)
    assert score["score"] == 0.0
    assert not Path("/tmp/rlcore-code-reward-pwned").exists()


def test_registered_for_code_data_sources():
    assert reward_function_for("code") is compute_score
    for source in ("codecontests", "deepmind/code_contests", "apps", "codeforces", "taco"):
        assert reward_function_for(source) is compute_score


def test_through_the_rule_provider_with_worker_processes(batch_of):
    """The reward worker runs the scorer; malicious or looping samples score 0 and the others are
    unaffected."""
    truth = json.dumps(ADD_TESTS)
    samples = [
        ("code", fenced("a, b = map(int, input().split())\nprint(a + b)"), truth),
        ("codecontests", fenced("while True:\n    pass"), truth),
        ("code", fenced("import os\nos.kill(os.getppid(), 9)"), truth),
        ("code", fenced("a, b = map(int, input().split())\nprint(a * b)"), truth),
        ("code", "no code", truth),
    ]
    provider = RuleRewardProvider(RewardConfig(num_workers=2, timeout_s=15.0))
    try:
        out = provider.score(batch_of(samples, lengths=[3, 4, 5, 6, 2]))
    finally:
        provider.close()
    scores = out["token_level_scores"].sum(dim=1).tolist()
    assert scores == [1.0, 0.0, 0.0, 0.25, 0.0]
    assert out.meta["metrics"]["reward/errors"] == 0.0
    assert out["reward_extra_info"][1]["timeouts"] == 4.0


def test_call_based_tests():
    truth = {"fn_name": "add", "inputs": [[1, 2], [10, -4], ["a", "b"]], "outputs": [3, [6], "ab"]}
    right = fenced("def add(x, y):\n    return x + y")
    assert compute_score("code", right, truth)["score"] == 1.0
    leetcode = fenced("class Solution:\n    def add(self, x, y):\n        return x + y")
    assert compute_score("code", leetcode, truth)["score"] == 1.0
    # Right for numbers only (the strings fail): 2 of 3.
    numbers = fenced("def add(x, y):\n    return int(x) + int(y)")
    assert compute_score("code", numbers, truth)["score"] == pytest.approx(2 / 3)
    # Printing what looks like the answer, or leaving early, passes nothing.
    cheat = fenced("print(3)\nimport sys\nsys.exit(0)")
    assert compute_score("code", cheat, truth)["score"] == 0.0
    pairs = {"fn_name": "pair", "inputs": [[1]], "outputs": [[1, 1]]}
    assert compute_score("code", fenced("def pair(x):\n    return (x, x)"), pairs)["score"] == 1.0

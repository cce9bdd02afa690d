"""Code reward: the last ```python block of a response, run against test cases in the sandbox.

The score is the fraction of test cases passed. Each test case is one sandbox call, so a solution that
crashes, loops, forks or tries to escape fails that test (status in the details) and never reaches the
reward worker; every call and the whole scoring are bounded in time.

``ground_truth`` (or a JSON string of it) is one of:

- ``{"inputs": [stdin, ...], "outputs": [stdout, ...]}``: the program reads stdin and must print the
  expected output (compared token by token, numbers to 1e-6 relative, as judges of programming contests
  do). This is the ``test_cases`` / ``input_output`` format of CodeContests, APPS and TACO in verl.
- ``{"asserts": ["assert f(1) == 2", ...]}`` or a list of such strings: each one runs after the
  solution's definitions (MBPP/HumanEval style).
- ``{"test_code": "..."}`` or one string: a single test program run after the solution.
- ``{"fn_name": "f", "inputs": [[args], ...], "outputs": [value, ...]}``: call-based tests (APPS, TACO):
  ``f(*args)`` (or ``Solution().f(*args)``) must return the value (or the value wrapped in a one-item
  list, as APPS stores some of them), compared after a JSON round trip.

>>> truth = {"inputs": ["2 3\\n", "10 -4\\n"], "outputs": ["5\\n", "6\\n"]}
>>> compute_score("code", "```python\\na, b = map(int, input().split())\\nprint(a + b)\\n```", truth)["score"]
1.0
>>> compute_score("code", "```python\\nprint(5)\\n```", truth)["score"]
0.5
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import time
from typing import Any

import attrs

from rlcore.sandbox import (
    Sandbox,
    SandboxLimits,
    SandboxResult,
    default_sandbox,
    get_sandbox,
    run_coroutine_sync,
)

_sandboxes: dict[Any, Sandbox] = {}


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of every closed fenced block in ``text``, in order (language lower-cased,
    ``""`` when the fence has none). A fence opens at the start of a line; it closes at a line that
    starts or ends with three backticks. A block left open (a truncated response) is dropped."""
    blocks: list[tuple[str, str]] = []
    language, body = "", None
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        if body is None:
            if stripped.startswith("```"):
                language, body = stripped[3:].strip().lower(), []
        elif stripped.startswith("```") or stripped.endswith("```"):
            body.append(line[: line.rfind("```")] if not stripped.startswith("```") else "")
            blocks.append((language, "".join(body)))
            body = None
        else:
            body.append(line)
    return blocks


def extract_code(solution_str: str) -> str | None:
    """The last fenced block labelled python (``python``, ``py``, ``python3``), or else the last one
    with no language; ``None`` when there is neither."""
    blocks = fenced_blocks(solution_str)
    python = [body for language, body in blocks if language in ("python", "py", "python3")]
    plain = [body for language, body in blocks if not language]
    return (python or plain or [None])[-1]


@attrs.frozen
class TestCase:
    """One test: a stdin/expected-stdout pair, a test program (asserts) run after the solution, or a
    call of the solution's function ``fn_name`` with ``args`` that must return ``value``."""

    stdin: str = ""
    expected: str | None = None
    test_code: str | None = None
    fn_name: str | None = None
    args: Any = None
    value: Any = None


def parse_tests(ground_truth: Any) -> list[TestCase]:
    """The test cases in ``ground_truth`` (see the module docstring); ``ValueError`` naming the format."""
    truth = ground_truth
    if isinstance(truth, str | bytes):
        try:
            truth = json.loads(truth)
        except ValueError:
            pass  # a plain test program
    if isinstance(truth, str):
        return [TestCase(test_code=truth)]
    if isinstance(truth, list | tuple):
        if all(isinstance(t, str) for t in truth):
            return [TestCase(test_code=t) for t in truth]
    elif isinstance(truth, dict):
        if "inputs" in truth and "outputs" in truth:
            inputs, outputs = list(truth["inputs"]), list(truth["outputs"])
            if len(inputs) != len(outputs):
                raise ValueError(f"{len(inputs)} inputs but {len(outputs)} outputs in the test cases")
            if truth.get("fn_name"):
                return [
                    TestCase(fn_name=str(truth["fn_name"]), args=_call_args(i), value=o)
                    for i, o in zip(inputs, outputs, strict=True)
                ]
            return [TestCase(stdin=_text(i), expected=_text(o)) for i, o in zip(inputs, outputs, strict=True)]
        if "asserts" in truth:
            return [TestCase(test_code=str(t)) for t in truth["asserts"]]
        if "test_code" in truth:
            return [TestCase(test_code=str(truth["test_code"]))]
    raise ValueError(
        "ground truth of a code problem must be {'inputs': [...], 'outputs': [...]}, {'asserts': [...]}, "
        f"{{'test_code': ...}}, a list of assert strings or a test program; got {type(truth).__name__} "
        f"{str(truth)[:80]!r}"
    )


def _call_args(value: Any) -> list[Any]:
    """Positional arguments of a call-based test: a list, or a JSON string of one (one argument else)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return [value]
    return list(value) if isinstance(value, list | tuple) else [value]


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "\n".join(map(str, value)) + "\n"
    return str(value)


def outputs_match(actual: str, expected: str, rel_tol: float = 1e-6) -> bool:
    """Whitespace-separated tokens equal, numbers within ``rel_tol`` (absolute near zero)."""
    got, want = actual.split(), expected.split()
    if len(got) != len(want):
        return False
    for a, b in zip(got, want, strict=True):
        if a == b:
            continue
        try:
            x, y = float(a), float(b)
        except ValueError:
            return False
        if not math.isclose(x, y, rel_tol=rel_tol, abs_tol=rel_tol):
            return False
    return True


def assert_program(solution: str, test_code: str) -> tuple[str, str]:
    """A program running ``solution`` then ``test_code``, and the secret ``stdin`` that proves it ran to
    the end: the last line it prints is the secret it read before the solution started. A solution that
    calls ``exit(0)`` early (a known reward hack) does not print it; the solution runs in its own
    namespace, so it does not hold the secret either."""
    secret = secrets.token_hex(16)
    program = (
        "import sys as _sys\n"
        "_secret = _sys.stdin.readline().strip()\n"
        "_namespace = {'__name__': 'solution'}\n"
        f"exec(compile({solution!r}, 'solution.py', 'exec'), _namespace)\n"
        f"exec(compile({test_code!r}, 'test.py', 'exec'), _namespace)\n"
        "print('\\n' + _secret)\n"
    )
    return program, secret + "\n"


def call_program(solution: str, fn_name: str) -> str:
    """A program that runs ``solution``, calls ``fn_name`` (a function, or a method of a ``Solution``
    class as LeetCode writes them) with the JSON arguments on its stdin's second line, and prints the
    secret of the first line followed by the JSON of the return value, last."""
    return (
        "import sys as _sys, json as _json\n"
        "_secret = _sys.stdin.readline().strip()\n"
        "_args = _json.loads(_sys.stdin.readline())\n"
        "_namespace = {'__name__': 'solution'}\n"
        f"exec(compile({solution!r}, 'solution.py', 'exec'), _namespace)\n"
        f"_fn = _namespace.get({fn_name!r}) or getattr(_namespace['Solution'](), {fn_name!r})\n"
        "_value = _fn(*_args)\n"
        "print('\\n' + _secret + _json.dumps(_value, default=repr))\n"
    )


def _returned(stdout: str, secret: str) -> tuple[bool, Any]:
    """``(True, value)`` if the last line of ``stdout`` is the secret and a JSON value, else ``(False, None)``."""
    last = stdout.rstrip("\n").rsplit("\n", 1)[-1]
    if not last.startswith(secret):
        return False, None
    try:
        return True, json.loads(last[len(secret) :])
    except ValueError:
        return False, None


def _same_value(value: Any, expected: Any) -> bool:
    expected = json.loads(json.dumps(expected, default=repr))  # tuples -> lists, as the value went
    return value == expected or [value] == expected


@attrs.frozen
class TestOutcome:
    passed: bool
    result: SandboxResult | None  # None: not run (the time budget ran out first)


async def run_tests(
    sandbox: Sandbox, solution: str, tests: list[TestCase], limits: SandboxLimits, budget_s: float
) -> list[TestOutcome]:
    """Run every test concurrently (the sandbox bounds how many at once); those not finished within
    ``budget_s`` count as failed."""

    async def one(test: TestCase) -> TestOutcome:
        if test.fn_name is not None:
            secret = secrets.token_hex(16)
            stdin = f"{secret}\n{json.dumps(test.args, default=repr)}\n"
            result = await sandbox.run(call_program(solution, test.fn_name), stdin=stdin, limits=limits)
            returned, value = _returned(result.stdout, secret)
            return TestOutcome(result.ok and returned and _same_value(value, test.value), result)
        if test.test_code is not None:
            program, stdin = assert_program(solution, test.test_code)
            result = await sandbox.run(program, stdin=stdin, limits=limits)
            lines = result.stdout.rstrip("\n").rsplit("\n", 1)
            return TestOutcome(result.ok and lines[-1] == stdin.strip(), result)
        result = await sandbox.run(solution, stdin=test.stdin, limits=limits)
        return TestOutcome(result.ok and outputs_match(result.stdout, test.expected or ""), result)

    tasks = [asyncio.create_task(one(t)) for t in tests]
    done, pending = await asyncio.wait(tasks, timeout=budget_s)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending)
    return [t.result() if t in done else TestOutcome(False, None) for t in tasks]


def _sandbox(name: str | None, options: dict[str, Any]) -> Sandbox:
    if name is None:
        return default_sandbox()
    key = (name, json.dumps(options, sort_keys=True, default=str))
    if key not in _sandboxes:
        _sandboxes[key] = get_sandbox(name, **options)
    return _sandboxes[key]


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    sandbox: str | None = None,
    sandbox_options: dict[str, Any] | None = None,
    timeout_s: float = 4.0,
    memory_mib: int = 512,
    time_budget_s: float = 8.0,
    max_tests: int | None = None,
) -> dict[str, Any]:
    """Pass fraction of the tests in ``ground_truth`` (verl's ``compute_score`` signature).

    Returns ``{"score", "passed", "total", "timeouts", "errors", "no_code"}`` (numbers, logged per
    sample). ``sandbox`` names the sandbox (with ``sandbox_options``); ``None`` takes the run's
    ``sandbox:`` section (:func:`rlcore.sandbox.default_sandbox`), whose limits this scorer replaces. ``timeout_s`` and ``memory_mib`` limit each test run; ``time_budget_s`` bounds the whole
    scoring and must stay below ``reward.timeout_s`` (tests still running then fail). A per-problem
    ``extra_info["time_limit_s"]`` overrides ``timeout_s``. ``max_tests`` keeps the first tests only.
    Bad ground truth raises ``ValueError`` (a data problem, reported by the reward provider).
    """
    tests = parse_tests(ground_truth)[:max_tests]
    code = extract_code(solution_str)
    if code is None or not tests:
        return {"score": 0.0, "passed": 0.0, "total": float(len(tests)), "timeouts": 0.0, "errors": 0.0,
                "no_code": float(code is None)}  # fmt: skip
    per_test = float((extra_info or {}).get("time_limit_s") or timeout_s)
    limits = SandboxLimits(cpu_s=per_test, wall_s=per_test * 1.5 + 0.5, memory_mib=memory_mib)
    box = _sandbox(sandbox, dict(sandbox_options or {}))
    deadline = time.monotonic() + time_budget_s
    outcomes = run_coroutine_sync(
        lambda: run_tests(box, code, tests, limits, max(0.0, deadline - time.monotonic()))
    )
    passed = sum(o.passed for o in outcomes)
    statuses = [o.result.status if o.result else "timeout" for o in outcomes]
    return {
        "score": passed / len(tests),
        "passed": float(passed),
        "total": float(len(tests)),
        "timeouts": float(statuses.count("timeout")),
        "errors": float(sum(s != "ok" and s != "timeout" for s in statuses)),
        "no_code": 0.0,
    }

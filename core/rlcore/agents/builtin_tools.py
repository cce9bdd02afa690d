"""The built-in tools: :class:`Calculator` (exact arithmetic, no code execution) and
:class:`PythonInterpreter` (a program run in the sandbox of :mod:`rlcore.sandbox`, never in this process).

>>> import asyncio
>>> asyncio.run(Calculator()(expression="123456789123456789 + 987654321987654321"))
'1111111111111111110'
>>> asyncio.run(Calculator()(expression="(2 ** 10 - 24) / 8"))
'125'
"""

from __future__ import annotations

import ast
import math
import operator
from fractions import Fraction
from typing import Any

from rlcore.agents.tools import Tool, ToolError

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
#: Longest expression and largest result (decimal digits) the calculator accepts: a bound on work.
MAX_EXPRESSION_CHARS = 2000
MAX_DIGITS = 10_000


class CalculatorError(ValueError):
    """The expression is not plain arithmetic, or its result is too large."""


def evaluate(expression: str) -> int | Fraction | float:
    """The value of arithmetic ``expression``: numbers, ``+ - * / // % **`` and parentheses only,
    parsed with :mod:`ast` (nothing is executed). Integers and ``/`` are exact (big integers,
    fractions); a float operand makes the result a float."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"not an arithmetic expression: {exc.msg}") from None
    return _eval(tree.body)


def _eval(node: ast.AST) -> int | Fraction | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        if isinstance(node.op, ast.Div) and not isinstance(left, float) and not isinstance(right, float):
            if right == 0:
                raise CalculatorError("division by zero")
            return Fraction(left) / Fraction(right)
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("result too large") from None
        _check_size(value)
        return value
    shown = ast.unparse(node) if hasattr(ast, "unparse") else type(node).__name__
    raise CalculatorError(f"{shown!r} is not allowed: use numbers, + - * / // % ** and parentheses")


def _check_power(base: Any, exponent: Any) -> None:
    if isinstance(exponent, int | Fraction) and abs(exponent) > 1 and base not in (0, 1, -1):
        digits = abs(float(exponent)) * math.log10(max(abs(float(base)), 2.0))
        if digits > MAX_DIGITS:
            raise CalculatorError(f"result too large (about {digits:.0f} digits; the limit is {MAX_DIGITS})")


def _check_size(value: Any) -> None:
    if isinstance(value, int) and value.bit_length() > MAX_DIGITS * 3.33:
        raise CalculatorError(f"result too large (more than {MAX_DIGITS} digits)")


def format_number(value: int | Fraction | float) -> str:
    """An integer as its digits, an exact fraction as an integer when whole or else a decimal to 12
    significant digits, a float by ``repr`` (``'125'``, ``'0.333333333333'``)."""
    if isinstance(value, Fraction):
        if value.denominator == 1:
            return str(value.numerator)
        return f"{float(value):.12g}"
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


class Calculator(Tool):
    """Exact arithmetic on an expression (big integers and fractions): what a small model cannot do."""

    name = "calculator"
    description = (
        "Evaluate an arithmetic expression exactly (integers of any size, + - * / // % ** and parentheses)."
    )
    parameters = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "for example: 123456789 + 987654321"}},
        "required": ["expression"],
    }
    timeout_s = 5.0

    async def __call__(self, expression: Any) -> str:
        if not isinstance(expression, str | int | float):
            raise CalculatorError(f"expression must be a string, got {type(expression).__name__}")
        return format_number(evaluate(str(expression)))


class PythonInterpreter(Tool):
    """Runs a Python program in a sandbox (a separate process with CPU, memory and wall-time limits, no
    network, a scratch directory; or a remote sandbox service) and returns its output.

    By default the run's sandbox (the ``sandbox:`` section, :func:`rlcore.sandbox.default_sandbox`).
    Options (``agent.tool_options.python``) choose another: ``sandbox`` (a registered name: ``local``,
    ``http`` ...) with ``sandbox_options`` (its keyword arguments, e.g. ``{url: ...}``), and ``limits``
    (:class:`rlcore.sandbox.SandboxLimits` fields) for every call of this tool.
    """

    name = "python"
    description = (
        "Run a Python 3 program and return what it prints (standard output, then standard error). "
        "Print the values you need; the program has no network and a few seconds of time."
    )
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "a complete Python program"}},
        "required": ["code"],
    }
    timeout_s = 30.0

    def __init__(
        self,
        *,
        timeout_s: float | None = None,
        sandbox: str | None = None,
        sandbox_options: dict[str, Any] | None = None,
        limits: dict[str, Any] | None = None,
    ):
        super().__init__(timeout_s=timeout_s)
        self.sandbox_name, self.sandbox_options = sandbox, dict(sandbox_options or {})
        self.limits = dict(limits or {})
        if self.sandbox_options and sandbox is None:
            raise TypeError("sandbox_options needs sandbox (the name of the sandbox they configure)")
        self._sandbox: Any = None

    def _get_sandbox(self) -> tuple[Any, Any]:
        # Imported on first call: the sandbox is its own module (and may need an HTTP client).
        from rlcore.sandbox import SandboxLimits, default_sandbox, get_sandbox

        if self._sandbox is None:
            if self.sandbox_name is None:
                self._sandbox = default_sandbox()
            else:
                self._sandbox = get_sandbox(self.sandbox_name, **self.sandbox_options)
        return self._sandbox, (SandboxLimits(**self.limits) if self.limits else None)

    async def __call__(self, code: Any) -> str:
        """The program's output; a failure (exception, timeout, memory, killed) raises :class:`ToolError`
        with the status, the exception's last line, then the output."""
        if not isinstance(code, str):
            raise TypeError(f"code must be a string, got {type(code).__name__}")
        sandbox, limits = self._get_sandbox()
        result = await sandbox.run(code, limits=limits)
        output = (result.stdout or "") + (result.stderr or "")
        if result.status == "ok" and result.exit_code == 0:
            return output
        why = {
            "timeout": "the program ran out of time",
            "memory": "the program ran out of memory",
            "killed": "the program was killed",
        }.get(result.status, f"the program failed (exit code {result.exit_code})")
        # The exception (a traceback's last line) first: a long tool message is cut from its end.
        last = next((line for line in reversed((result.stderr or "").splitlines()) if line.strip()), "")
        head = why + (f": {last.strip()}" if last else "")
        raise ToolError(f"{head}\n{output}".rstrip("\n"))

    def close(self) -> None:
        # The run's default sandbox is shared by the process; only a sandbox of this tool's own is closed.
        close = getattr(self._sandbox, "close", None)
        if self.sandbox_name is not None and callable(close):
            close()

"""Tool calls in a model turn's text, in the Hermes format Qwen2.5/Qwen3 chat templates teach:

``<tool_call>{"name": "calculator", "arguments": {"expression": "2 + 3"}}</tool_call>``

A turn may hold several calls; the text outside them is the turn's content. A call whose body is not a
JSON object with a string ``name`` and an object ``arguments`` (a JSON string of one is accepted, as some
models write it) is still returned, with ``error`` saying what is wrong, so the model is told in a tool
message instead of the call vanishing.

>>> calls = parse_tool_calls('Let me add.<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>')
>>> calls[0].name, calls[0].arguments
('calculator', {'expression': '2+3'})
>>> parse_tool_calls('<tool_call>{"name": 1}</tool_call>')[0].error
'could not parse the tool call {"name": 1}: "name" must be a string'
>>> parse_tool_calls("The answer is 5.")
[]
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs

#: The formats :func:`parse_tool_calls` reads (``agent.tool_call_format``).
FORMATS = ("hermes",)

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_SHOWN = 200  # characters of a bad call quoted back to the model


@attrs.define(frozen=True)
class ToolCall:
    """One call: the tool's ``name`` and its ``arguments``; ``error`` when the call could not be read."""

    name: str | None
    arguments: dict[str, Any] = attrs.field(factory=dict)
    error: str | None = None


def parse_tool_calls(text: str, format: str = "hermes") -> list[ToolCall]:
    """Every tool call in ``text``, in order (an empty list: the turn is an answer)."""
    if format not in FORMATS:
        raise ValueError(f"agent.tool_call_format must be one of {', '.join(FORMATS)}, got {format!r}")
    return [_hermes_call(body.strip()) for body in _HERMES.findall(text)]


def _hermes_call(body: str) -> ToolCall:
    shown = body if len(body) <= _SHOWN else body[:_SHOWN] + "..."

    def bad(why: str) -> ToolCall:
        return ToolCall(None, {}, f"could not parse the tool call {shown}: {why}")

    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return bad(f"not JSON ({exc.msg} at character {exc.pos})")
    if not isinstance(obj, dict):
        return bad('expected an object {"name": ..., "arguments": {...}}')
    name, arguments = obj.get("name"), obj.get("arguments", {})
    if not isinstance(name, str) or not name:
        return bad('"name" must be a string')
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return attrs.evolve(bad('"arguments" is a string that is not JSON'), name=name)
    if not isinstance(arguments, dict):
        return attrs.evolve(bad('"arguments" must be an object'), name=name)
    return ToolCall(name, arguments)

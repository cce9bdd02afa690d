"""Tools an agent can call: the :class:`Tool` contract, building the configured tools, and running one call.

A tool is a class registered by a plugin's ``register_tools(register)`` hook
(``register("calculator", "rlcore.agents.builtin_tools:Calculator")``). It declares its ``name``, a
``description`` and the JSON schema of its arguments (``parameters``), which the chat template is offered
(``tools=[tool.schema() ...]``) so the model knows how to call it; ``__call__`` is async and returns the
text of the tool message. :func:`call_tool` runs one parsed call under the tool's timeout: an unknown
tool, bad arguments, an exception or a timeout becomes an ``Error: ...`` tool message the model reads on
its next turn, never a crashed episode.

>>> import asyncio
>>> class Echo(Tool):
...     name, description = "echo", "Repeat the text."
...     parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
...     async def __call__(self, text: str) -> str:
...         return text
>>> asyncio.run(call_tool({"echo": Echo()}, ToolCall("echo", {"text": "hi"}))).text
'hi'
>>> asyncio.run(call_tool({"echo": Echo()}, ToolCall("echo", {}))).text
"Error: tool 'echo' needs argument(s) 'text'"
"""

from __future__ import annotations

import abc
import asyncio
import inspect
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import attrs

from rlcore.agents.tool_calls import ToolCall


class Tool(abc.ABC):
    """One callable tool. Subclasses set the class attributes and implement :meth:`__call__`.

    ``parameters`` is a JSON schema of an object (``{"type": "object", "properties": {...},
    "required": [...]}``): the model's ``arguments`` are checked against its ``required`` keys and
    ``properties`` names before the call. ``timeout_s``: seconds a call may take (the
    ``agent.tool_timeout_s`` setting overrides it when the tool is built with ``timeout_s=``).
    Constructor keyword arguments come from ``agent.tool_options.<name>``.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]
    timeout_s: float = 30.0

    def __init__(self, *, timeout_s: float | None = None, **options: Any):
        if options:
            raise TypeError(
                f"tool {self.name!r} takes no options, got {sorted(options)} (agent.tool_options.{self.name})"
            )
        if timeout_s is not None:
            self.timeout_s = float(timeout_s)

    @abc.abstractmethod
    async def __call__(self, **arguments: Any) -> str:
        """Run with the model's ``arguments``; return the tool message's text. Raise on failure: the
        exception's text becomes the message."""

    @classmethod
    def schema(cls) -> dict[str, Any]:
        """The OpenAI-style function schema chat templates take in ``tools=``."""
        return {
            "type": "function",
            "function": {"name": cls.name, "description": cls.description, "parameters": cls.parameters},
        }

    def close(self) -> None:
        """Release what the tool holds (processes, sessions). Default: nothing."""


class ToolError(Exception):
    """Raised by a tool whose message is the whole explanation: the model reads ``Error: <message>``
    (any other exception reads ``Error: <Type>: <message>``). Either way the call counts as failed."""


@attrs.define(frozen=True)
class ToolResult:
    """What one call produced: the tool message's ``text`` and ``status`` (``ok``, ``error``,
    ``timeout``, ``unknown_tool``, ``bad_arguments``)."""

    name: str
    text: str
    status: str = "ok"

    @property
    def ok(self) -> bool:
        return self.status == "ok"


async def call_tool(tools: Mapping[str, Tool], call: ToolCall) -> ToolResult:
    """Run ``call`` with the tool it names, under that tool's timeout; every failure is a result."""
    if call.error is not None:
        return ToolResult(call.name or "", f"Error: {call.error}", "bad_arguments")
    tool = tools.get(call.name)
    if tool is None:
        known = ", ".join(sorted(tools)) or "(none)"
        return ToolResult(
            call.name, f"Error: unknown tool {call.name!r}; available tools: {known}", "unknown_tool"
        )
    problem = argument_problem(tool, call.arguments)
    if problem is not None:
        return ToolResult(call.name, f"Error: tool {call.name!r} {problem}", "bad_arguments")
    try:
        text = await asyncio.wait_for(tool(**call.arguments), timeout=tool.timeout_s)
    except TimeoutError:
        return ToolResult(
            call.name, f"Error: tool {call.name!r} timed out after {tool.timeout_s:g} s", "timeout"
        )
    except ToolError as exc:
        return ToolResult(call.name, f"Error: {exc}", "error")
    except Exception as exc:  # the model reads what went wrong; the episode goes on
        return ToolResult(call.name, f"Error: {type(exc).__name__}: {exc}", "error")
    return ToolResult(call.name, str(text), "ok")


def argument_problem(tool: Tool, arguments: Mapping[str, Any]) -> str | None:
    """Why ``arguments`` cannot be passed to ``tool`` (missing required keys, unknown names), or ``None``."""
    schema = tool.parameters or {}
    required = [k for k in schema.get("required", []) if k not in arguments]
    if required:
        return "needs argument(s) " + ", ".join(repr(k) for k in required)
    properties = schema.get("properties")
    accepts_any = any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(tool.__call__).parameters.values()
    )
    if properties is not None and not accepts_any:
        unknown = sorted(set(arguments) - set(properties))
        if unknown:
            return f"got unknown argument(s) {', '.join(map(repr, unknown))}; it takes {', '.join(map(repr, properties)) or 'none'}"
    return None


def build_tools(
    names: Sequence[str],
    options: Mapping[str, Mapping[str, Any]] | None = None,
    timeout_s: float | None = None,
) -> dict[str, Tool]:
    """Instances of the registered tools ``names`` (``agent.tools``), each built with its
    ``options[name]`` (``agent.tool_options``) and ``timeout_s`` (``agent.tool_timeout_s``).
    An unknown name is an error listing the registered tools."""
    from rlcore.plugins import registry

    options = dict(options or {})
    stray = sorted(set(options) - set(names))
    if stray:
        raise ValueError(
            f"agent.tool_options names {stray}, which agent.tools={list(names)} does not list; add them to "
            f"agent.tools or remove their options"
        )
    tools: dict[str, Tool] = {}
    for name in names:
        cls = registry("tools").get(name)
        try:
            tool = cls(timeout_s=timeout_s, **dict(options.get(name, {})))
        except TypeError as exc:
            raise ValueError(f"agent.tool_options.{name}: {exc}") from exc
        if tool.name != name:
            raise ValueError(
                f"tool registered as {name!r} calls itself {tool.name!r} (its name attribute); the model calls "
                f"tools by that name, so register it under the same one"
            )
        tools[name] = tool
    return tools


def tool_schemas(names: Sequence[str]) -> list[dict[str, Any]]:
    """The ``tools=`` list for the chat template: each registered tool's schema, from its class (no
    tool is built, so nothing starts on the driver)."""
    from rlcore.plugins import registry

    return [registry("tools").get(name).schema() for name in names]

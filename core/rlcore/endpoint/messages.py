"""OpenAI chat messages as the endpoint reads and writes them.

A request's messages are normalised once (:func:`normalize_messages`): content parts joined into text,
tool-call arguments parsed from their JSON strings into objects (what Hugging Face chat templates render).
A sampled turn goes back to the agent as an assistant message (:func:`assistant_message`): its text, with
each well-formed Hermes tool call (``<tool_call>{...}</tool_call>``) moved into ``tool_calls`` when the
request offered tools. :func:`turn_key` is what must come back unchanged for the endpoint to reuse the
turn's sampled tokens: the content and the calls' names and arguments (call ids and JSON spacing may differ).

>>> msg = assistant_message('Adding.<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', "c0", True)
>>> msg["content"], msg["tool_calls"][0]["function"]
('Adding.', {'name': 'add', 'arguments': '{"a": 1}'})
>>> echoed = {"role": "assistant", "content": "Adding.", "tool_calls": [
...     {"id": "x", "type": "function", "function": {"name": "add", "arguments": '{ "a":1 }'}}]}
>>> turn_key(normalize_messages([echoed])[0]) == turn_key(normalize_messages([msg])[0])
True
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from rlcore.agents.tool_calls import parse_tool_calls

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
ROLES = ("system", "developer", "user", "assistant", "tool")


class MessageError(ValueError):
    """A request's messages cannot be read (the client gets a 400 with this text)."""


def content_text(content: Any, where: str) -> str:
    """The text of a message's ``content``: a string, ``None`` (empty) or a list of ``text`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for k, part in enumerate(content):
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise MessageError(
                    f"{where}.content[{k}] is a {kind!r} part; the rlcore endpoint serves text parts only"
                )
            texts.append(part["text"])
        return "".join(texts)
    raise MessageError(f"{where}.content must be a string, null or a list of text parts")


def _arguments(raw: Any, where: str) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as exc:
            raise MessageError(f"{where}.function.arguments is not JSON: {exc.msg}") from exc
        if isinstance(value, dict):
            return value
    raise MessageError(f"{where}.function.arguments must be a JSON object (or its JSON text)")


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """``messages`` as chat-template input: ``role``, ``content`` text, and for assistant messages
    ``tool_calls`` with object ``arguments``; tool messages keep ``tool_call_id`` and ``name``."""
    if not isinstance(messages, list) or not messages:
        raise MessageError("messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise MessageError(f"{where} must be an object with a role and content")
        role = m.get("role")
        if role not in ROLES:
            raise MessageError(f"{where}.role must be one of {', '.join(ROLES)}; got {role!r}")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role}
        msg["content"] = content_text(m.get("content"), where)
        for key in ("name", "tool_call_id"):
            if isinstance(m.get(key), str):
                msg[key] = m[key]
        calls = m.get("tool_calls")
        if role == "assistant" and calls:
            if not isinstance(calls, list):
                raise MessageError(f"{where}.tool_calls must be a list")
            msg["tool_calls"] = []
            for k, call in enumerate(calls):
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise MessageError(f"{where}.tool_calls[{k}] must have function.name")
                arguments = _arguments(fn.get("arguments", {}), f"{where}.tool_calls[{k}]")
                msg["tool_calls"].append(
                    {
                        "id": call.get("id"),
                        "type": "function",
                        "function": {"name": fn["name"], "arguments": arguments},
                    }
                )
        out.append(msg)
    return out


def turn_key(message: dict[str, Any]) -> tuple[str, tuple[tuple[str, str], ...]]:
    """What identifies an assistant turn (a normalised message): its content and its calls' names and
    arguments (as canonical JSON)."""
    calls = tuple(
        (c["function"]["name"], json.dumps(c["function"]["arguments"], sort_keys=True))
        for c in message.get("tool_calls") or ()
    )
    return message.get("content") or "", calls


def assistant_message(text: str, call_prefix: str, parse_calls: bool) -> dict[str, Any]:
    """The OpenAI assistant message of a sampled turn's ``text``: with ``parse_calls``, each well-formed
    Hermes call becomes an entry of ``tool_calls`` (ids ``<call_prefix>_<k>``) and leaves the content,
    which is then stripped; a malformed call stays in the content, where the agent can see it."""
    calls: list[dict[str, Any]] = []
    content = text
    if parse_calls:
        kept, last = [], 0
        for match in _HERMES.finditer(text):
            (call,) = parse_tool_calls(match.group(0))
            if call.error is not None:
                continue
            kept.append(text[last : match.start()])
            last = match.end()
            calls.append(
                {
                    "id": f"{call_prefix}_{len(calls)}",
                    "type": "function",
                    "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
                }
            )
        if calls:
            content = ("".join(kept) + text[last:]).strip()
    message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return message


def assistant_positions(messages: Sequence[dict[str, Any]]) -> list[int]:
    """Indices of the assistant messages."""
    return [i for i, m in enumerate(messages) if m["role"] == "assistant"]

"""The chat-completions wire format: a request's fields read with the errors a client sees, and the
response (or its server-sent-event chunks) written as the ``openai`` client parses them.

Served: ``messages``, ``tools`` and ``tool_choice`` (``auto``/``none``), ``n``, ``temperature``, ``top_p``,
``max_tokens``/``max_completion_tokens``, ``stop``, ``logprobs`` (the sampled token's; ``top_logprobs``
0), ``stream`` with ``stream_options.include_usage``, ``seed`` and ``user``. ``model`` may name anything.
A field that would change what is sampled and that the engines cannot honour (penalties, ``logit_bias``,
structured output, forced tool calls) is refused with a 400 naming it, rather than ignored.

>>> r = parse_request({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stop": "\\n"})
>>> r.max_tokens, r.stop, r.n
(8, ('\\n',), 1)
>>> parse_request({"messages": [{"role": "user", "content": "hi"}], "frequency_penalty": 0.5})
Traceback (most recent call last):
...
rlcore.endpoint.protocol.RequestError: frequency_penalty=0.5 is not served by the rlcore endpoint (the rollout engines sample without it); leave it unset
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import attrs

from rlcore.endpoint.messages import MessageError, normalize_messages


class RequestError(ValueError):
    """A request the endpoint refuses; ``status`` is the HTTP status, ``code`` the OpenAI error code."""

    def __init__(self, message: str, status: int = 400, code: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.code = status, code


@attrs.define(frozen=True)
class ChatRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    parse_tool_calls: bool = False
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    stream: bool = False
    include_usage: bool = False
    model: str = "policy"
    user: str | None = None


#: Fields that change sampling, with the value meaning "off".
_UNSERVED = {"frequency_penalty": 0, "presence_penalty": 0, "logit_bias": None, "repetition_penalty": 1}


def _number(body: dict, key: str, kind: type, low: float | None = None) -> Any:
    value = body.get(key)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (kind is int and not isinstance(value, int))
    ):
        raise RequestError(f"{key} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    if low is not None and value < low:
        raise RequestError(f"{key} must be >= {low}, got {value!r}")
    return kind(value)


def parse_request(body: Any) -> ChatRequest:
    """The request of a chat-completions JSON ``body``; a :class:`RequestError` names what is wrong."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    for key, off in _UNSERVED.items():
        if body.get(key) not in (None, off, {}):
            raise RequestError(
                f"{key}={body[key]!r} is not served by the rlcore endpoint (the rollout engines sample "
                f"without it); leave it unset"
            )
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise RequestError("response_format other than text is not served by the rlcore endpoint")
    top = body.get("top_logprobs")
    if top not in (None, 0):
        raise RequestError(
            "top_logprobs is not served: the rollout engines return the sampled token's log-prob only"
        )
    try:
        messages = normalize_messages(body.get("messages"))
    except MessageError as exc:
        raise RequestError(str(exc)) from exc
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise RequestError("tools must be a list of tool objects")
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise RequestError(
            f"tool_choice={choice!r} is not served: the endpoint cannot force a call; use auto or none"
        )
    stop = body.get("stop")
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if not all(isinstance(s, str) and s for s in stops):
        raise RequestError("stop must be a non-empty string or a list of them")
    max_tokens = _number(body, "max_completion_tokens", int, 1)
    if max_tokens is None:
        max_tokens = _number(body, "max_tokens", int, 1)
    options = body.get("stream_options") or {}
    user = body.get("user")
    return ChatRequest(
        messages=messages,
        tools=tools or None,
        parse_tool_calls=bool(tools) and choice != "none",
        n=_number(body, "n", int, 1) or 1,
        temperature=_number(body, "temperature", float, 0),
        top_p=_number(body, "top_p", float, 0),
        max_tokens=max_tokens,
        stop=stops,
        logprobs=bool(body.get("logprobs")),
        stream=bool(body.get("stream")),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        model=str(body.get("model") or "policy"),
        user=user if isinstance(user, str) else None,
    )


def error_body(message: str, code: str = "invalid_request_error") -> dict[str, Any]:
    """An OpenAI error object (what the ``openai`` client turns into its exception's message)."""
    return {"error": {"message": message, "type": code, "code": code, "param": None}}


@attrs.define(frozen=True)
class Choice:
    """One sampled choice: the assistant ``message``, its ``finish_reason`` and per-token ``(text, log_prob)``."""

    message: dict[str, Any]
    finish_reason: str
    tokens: Sequence[tuple[str, float]]


def finish_reason(engine_reason: str, message: dict[str, Any]) -> str:
    if message.get("tool_calls"):
        return "tool_calls"
    return "length" if engine_reason == "length" else "stop"


def _logprobs(tokens: Sequence[tuple[str, float]]) -> dict[str, Any]:
    return {
        "content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")), "top_logprobs": []}
            for t, lp in tokens
        ],
        "refusal": None,
    }


def response_body(
    request: ChatRequest, response_id: str, choices: Sequence[Choice], usage: dict[str, int]
) -> dict[str, Any]:
    """A ``chat.completion`` object."""
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.model,
        "choices": [
            {
                "index": i,
                "message": c.message,
                "logprobs": _logprobs(c.tokens) if request.logprobs else None,
                "finish_reason": c.finish_reason,
            }
            for i, c in enumerate(choices)
        ],
        "usage": usage,
    }


def stream_events(
    request: ChatRequest, response_id: str, choices: Sequence[Choice], usage: dict[str, int]
) -> list[bytes]:
    """The ``chat.completion.chunk`` server-sent events of a finished sample, ``[DONE]`` last: per
    choice the role, then one chunk per token of content (with its log-prob when asked), the tool calls,
    and the finish reason; the usage chunk when ``stream_options.include_usage``."""
    created = int(time.time())

    def event(delta: dict[str, Any], index: int, reason: str | None = None, logprobs: Any = None) -> bytes:
        chunk = {
            "id": response_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": request.model,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}],
        }
        return f"data: {json.dumps(chunk)}\n\n".encode()

    out = []
    for i, c in enumerate(choices):
        out.append(event({"role": "assistant", "content": ""}, i))
        if c.message.get("tool_calls"):  # content without calls is no longer the tokens' concatenation
            if c.message.get("content"):
                out.append(event({"content": c.message["content"]}, i))
            calls = [{"index": k, **call} for k, call in enumerate(c.message["tool_calls"])]
            out.append(event({"tool_calls": calls}, i))
        else:
            for text, lp in c.tokens:
                logprobs = _logprobs([(text, lp)]) if request.logprobs else None
                out.append(event({"content": text}, i, logprobs=logprobs))
        out.append(event({}, i, c.finish_reason))
    if request.include_usage:
        chunk = {
            "id": response_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": request.model,
            "choices": [],
            "usage": usage,
        }
        out.append(f"data: {json.dumps(chunk)}\n\n".encode())
    out.append(b"data: [DONE]\n\n")
    return out

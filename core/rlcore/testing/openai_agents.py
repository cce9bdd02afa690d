"""Agent programs written with the ``openai`` client, for tests of the chat endpoint (:mod:`rlcore.endpoint`).

:func:`scripted_agent` is an ordinary multi-turn chat agent: each turn it sends the conversation so far,
with the decoded assistant text of every earlier reply, and adds a user message. What it does besides is
read from its row's ``extra_info["script"]`` so that one program covers the suite's cases:

- ``turns`` (3): requests it makes; ``max_tokens`` (6) per request; ``n`` (1) choices per request;
- ``stream`` (False): read each reply as server-sent events and join the pieces;
- ``edit_at``: before that request (0-based), change the latest assistant message (the agent "edits history");
- ``hang_after``: after that many requests, wait forever (an agent that never answers);
- ``tools``: offer a ``calculator`` tool and answer each returned call with the sandbox's result.

It returns ``{"score": <requests made>, "contents": [...]}``. :data:`CONCURRENCY` counts how many of its
runs are in flight at once (``peak``), for the concurrency bound's test.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

#: ``{"now": runs in flight, "peak": most at once}``; tests reset it.
CONCURRENCY = {"now": 0, "peak": 0}

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


async def _reply(client: Any, stream: bool, **request: Any) -> dict[str, Any]:
    """The first choice as the assistant message the agent sends back (``content``, ``tool_calls``)."""
    if not stream:
        response = await client.chat.completions.create(**request)
        message = response.choices[0].message
        out: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in message.tool_calls]
        return out
    pieces, calls = [], []
    async for chunk in await client.chat.completions.create(stream=True, **request):
        for choice in chunk.choices:
            if choice.index != 0:
                continue
            if choice.delta.content:
                pieces.append(choice.delta.content)
            for call in choice.delta.tool_calls or ():
                calls.append({"id": call.id, "type": "function", "function": call.function.model_dump()})
    out = {"role": "assistant", "content": "".join(pieces)}
    if calls:
        out["tool_calls"] = calls
    return out


async def scripted_agent(base_url: str, api_key: str, row: dict[str, Any]) -> dict[str, Any]:
    import openai

    script = (row.get("extra_info") or {}).get("script", {})
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = list(row["prompt"])
    contents = []
    CONCURRENCY["now"] += 1
    CONCURRENCY["peak"] = max(CONCURRENCY["peak"], CONCURRENCY["now"])
    try:
        for k in range(int(script.get("turns", 3))):
            if k == script.get("hang_after"):
                await asyncio.Event().wait()
            if k == script.get("edit_at"):
                last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
                messages[last] = {"role": "assistant", "content": f"{messages[last]['content']} (edited)"}
            request: dict[str, Any] = {
                "model": "policy",
                "messages": messages,
                "max_tokens": int(script.get("max_tokens", 6)),
                "n": int(script.get("n", 1)),
                "logprobs": True,
            }
            if script.get("tools"):
                request["tools"] = [CALCULATOR]
            reply = await _reply(client, bool(script.get("stream")), **request)
            contents.append(reply["content"])
            messages.append(reply)
            if reply.get("tool_calls"):
                for call in reply["tool_calls"]:
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": await _run(call)})
            else:
                messages.append({"role": "user", "content": f"Go on ({k})."})
    finally:
        CONCURRENCY["now"] -= 1
        await client.close()
    return {"score": float(len(contents)), "contents": contents}


async def _run(call: dict[str, Any]) -> str:
    """A calculator call's result, computed by a Python program in the run's sandbox."""
    from rlcore.sandbox import default_sandbox

    expression = json.loads(call["function"]["arguments"]).get("expression", "")
    result = await default_sandbox().run(
        "import sys; print(eval(sys.stdin.read(), {'__builtins__': {}}))", stdin=expression
    )
    return result.stdout.strip() if result.status == "ok" else f"Error: {result.status}"


# -- checks of a trained row against what the engine sampled ---------------------------------------
class EngineSpy:
    """The engine, keeping every ``agenerate`` call's prompt ids and completions."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    async def agenerate(self, prompt, params):
        out = await self.engine.agenerate(prompt, params)
        self.calls.append((list(prompt), out))
        return out


def sampled_spans(row):
    """``(start, end)`` of each run of model tokens in the response."""
    spans, start = [], None
    for t, m in enumerate([*row.response_mask, 0]):
        if m and start is None:
            start = t
        if not m and start is not None:
            spans.append((start, t))
            start = None
    return spans


def assert_exactly_sampled(row, calls):
    """Each model-token span is one of the engine's completions for exactly the ids before it."""
    for start, end in sampled_spans(row):
        prefix = row.prompt_ids + row.token_ids[:start]
        outputs = [c for prompt, out in calls if prompt == prefix for c in out]
        match = [c for c in outputs if c.token_ids == row.token_ids[start:end]]
        assert match, f"span {start}:{end} is not what the engine sampled after its prefix"
        assert row.log_probs[start:end] == match[0].log_probs
    assert all(lp == 0.0 for lp, m in zip(row.log_probs, row.response_mask, strict=True) if not m)


def float64_log_probs(model, row):
    """The log-probs of ``row``'s response tokens under ``model`` (a float64 HF model) at temperature 1."""
    import torch

    ids = torch.tensor([row.prompt_ids + row.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].double()
    lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
    return lp[len(row.prompt_ids) - 1 :]

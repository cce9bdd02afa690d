"""A calculator agent written with the ``openai`` package only: what rlcore trains without a rewrite.

It offers the model a ``calculator`` tool, runs each call the model makes (exact arithmetic on the
expression, parsed with ``ast``: nothing is executed), sends the result back as a tool message, and stops
at the first reply without a call. It sends back the assistant messages exactly as it received them; the
endpoint turns them back into the tokens the model sampled.

Two ways to run it under ``rlcore train`` (docs/agents.md, "Agent programs"):

    rlcore train agent.program=calculator_agent:agent ...            # importable in the rollout workers
    rlcore train 'agent.command=[python, examples/agents/calculator_agent.py]' ...

As a command it reads the endpoint from ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` (which the ``openai``
client reads by itself) and the data row as JSON on stdin, and prints nothing but its value: the row's
reward function scores the final answer.
"""

from __future__ import annotations

import ast
import asyncio
import json
import operator
import sys

import openai

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression exactly, e.g. '4821 + 9033'.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def calculate(expression: str) -> str:
    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        raise ValueError("only + - * // on integers")

    try:
        return str(value(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"Error: {exc}"


async def agent(base_url: str | None, api_key: str | None, row: dict, max_turns: int = 4) -> None:
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key)
    messages = list(row["prompt"])
    try:
        for _ in range(max_turns):
            reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return None  # the answer: the row's reward function scores it
            for call in message.tool_calls:
                expression = json.loads(call.function.arguments).get("expression", "")
                messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(expression)})
    finally:
        await client.close()
    return None


if __name__ == "__main__":
    asyncio.run(agent(None, None, json.load(sys.stdin)))

"""Tools: the calculator against Python's exact arithmetic, and call_tool turning every failure into a
tool message (unknown tool, bad arguments, exception, timeout)."""

import asyncio
import random
from fractions import Fraction

import pytest
from rlcore.agents.builtin_tools import Calculator, CalculatorError, evaluate
from rlcore.agents.tool_calls import ToolCall
from rlcore.agents.tools import Tool, ToolError, build_tools, call_tool, tool_schemas
from rlcore.plugins import registry


def run(coro):
    return asyncio.run(coro)


def test_calculator_adds_big_integers_exactly():
    rng = random.Random(0)
    for _ in range(50):
        a, b = rng.randrange(10**30), rng.randrange(10**30)
        assert run(Calculator()(expression=f"{a} + {b}")) == str(a + b)
        assert run(Calculator()(expression=f"{a} * {b} - {b}")) == str(a * b - b)


def test_calculator_division_and_precedence():
    assert evaluate("(7 - 1) / 4") == Fraction(3, 2)
    assert run(Calculator()(expression="(7 - 1) / 4")) == "1.5"
    assert run(Calculator()(expression="2 + 3 * 4 ** 2 // 5 % 7")) == str(2 + 3 * 4**2 // 5 % 7)
    assert run(Calculator()(expression="-2.5 * 2")) == "-5"


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('true')",
        "open('x')",
        "a + 1",
        "[1] * 3",
        "1 if 1 else 2",
        "9 ** 9 ** 9",
        "1 / 0",
        "1 +",
    ],
)
def test_calculator_refuses_what_is_not_bounded_arithmetic(expression):
    with pytest.raises(CalculatorError):
        evaluate(expression)


class Slow(Tool):
    name, description = "slow", "Sleeps."
    parameters = {"type": "object", "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]}
    timeout_s = 0.2

    async def __call__(self, seconds):
        await asyncio.sleep(seconds)
        return "woke"


class Broken(Tool):
    name, description, parameters = "broken", "Raises.", {"type": "object", "properties": {}}

    async def __call__(self):
        raise RuntimeError("disk on fire")


class Refuses(Tool):
    name, description, parameters = (
        "refuses",
        "Fails with its own words.",
        {"type": "object", "properties": {}},
    )

    async def __call__(self):
        raise ToolError("no such city; try a capital")


TOOLS = {"slow": Slow(), "broken": Broken(), "calculator": Calculator(), "refuses": Refuses()}


@pytest.mark.parametrize(
    ("call", "status", "text"),
    [
        (ToolCall("calculator", {"expression": "2+2"}), "ok", "4"),
        (
            ToolCall("search", {"q": "x"}),
            "unknown_tool",
            "Error: unknown tool 'search'; available tools: broken, calculator, refuses, slow",
        ),
        (
            ToolCall("calculator", {}),
            "bad_arguments",
            "Error: tool 'calculator' needs argument(s) 'expression'",
        ),
        (
            ToolCall("calculator", {"expression": "1", "mode": "x"}),
            "bad_arguments",
            "unknown argument(s) 'mode'",
        ),
        (
            ToolCall(None, {}, "could not parse the tool call {: not JSON"),
            "bad_arguments",
            "Error: could not parse",
        ),
        (ToolCall("broken", {}), "error", "Error: RuntimeError: disk on fire"),
        (ToolCall("refuses", {}), "error", "Error: no such city; try a capital"),
        (ToolCall("calculator", {"expression": "os.system('x')"}), "error", "Error: CalculatorError: "),
        (ToolCall("slow", {"seconds": 5}), "timeout", "Error: tool 'slow' timed out after 0.2 s"),
        (ToolCall("slow", {"seconds": 0}), "ok", "woke"),
    ],
)
def test_call_tool_turns_failures_into_messages(call, status, text):
    result = run(call_tool(TOOLS, call))
    assert result.status == status
    assert text in result.text


def test_builtin_tools_are_registered_and_built_with_options():
    assert {"calculator", "python"} <= set(registry("tools").names())
    tools = build_tools(["calculator"], {"calculator": {}}, timeout_s=1.5)
    assert tools["calculator"].timeout_s == 1.5
    schema = tool_schemas(["calculator"])[0]
    assert schema["function"]["name"] == "calculator"
    assert schema["function"]["parameters"]["required"] == ["expression"]


def test_build_tools_errors_name_the_key():
    with pytest.raises(ValueError, match=r"agent.tool_options.calculator: .*takes no options"):
        build_tools(["calculator"], {"calculator": {"precision": 3}})
    with pytest.raises(ValueError, match="agent.tool_options names \\['python'\\]"):
        build_tools(["calculator"], {"python": {}})
    with pytest.raises(LookupError, match="(?s)unknown tool 'calculater'.*Did you mean 'calculator'"):
        build_tools(["calculater"])


def test_prompts_offer_the_tools_only_when_the_agent_is_on():
    from rlcore.agents import AgentConfig
    from rlcore.agents.config import data_with_tools
    from rlcore.data import DataConfig

    data = DataConfig(apply_chat_template_kwargs={"enable_thinking": False})
    on = data_with_tools(data, AgentConfig(enabled=True, tools=["calculator", "python"]))
    names = [t["function"]["name"] for t in on.apply_chat_template_kwargs["tools"]]
    assert names == ["calculator", "python"] and on.apply_chat_template_kwargs["enable_thinking"] is False
    assert data_with_tools(data, AgentConfig(enabled=False)) is data
    own = DataConfig(apply_chat_template_kwargs={"tools": []})
    assert data_with_tools(own, AgentConfig(enabled=True)) is own


def test_agent_config_errors_name_the_key():
    from rlcore.agents import AgentConfig

    with pytest.raises(ValueError, match="agent.max_turns must be > 0"):
        AgentConfig(max_turns=0)
    with pytest.raises(ValueError, match="agent.tool_call_format must be one of hermes"):
        AgentConfig(tool_call_format="xml")

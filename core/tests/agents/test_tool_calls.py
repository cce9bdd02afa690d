"""The Hermes tool-call parser against calls written out by hand."""

import pytest
from rlcore.agents.tool_calls import ToolCall, parse_tool_calls


def test_one_call_and_text_around_it():
    text = 'I will add.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call><|im_end|>'
    assert parse_tool_calls(text) == [ToolCall("calculator", {"expression": "2 + 3"})]


def test_several_calls_in_order_and_string_arguments():
    text = (
        '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> and '
        '<tool_call>{"name": "b", "arguments": "{\\"y\\": [1, 2]}"}</tool_call>'
    )
    assert parse_tool_calls(text) == [ToolCall("a", {"x": 1}), ToolCall("b", {"y": [1, 2]})]


def test_missing_arguments_is_an_empty_object():
    assert parse_tool_calls('<tool_call>{"name": "now"}</tool_call>') == [ToolCall("now", {})]


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ('{"name": "calc", "arguments": {', "not JSON"),
        ("[1, 2]", "expected an object"),
        ('{"arguments": {}}', '"name" must be a string'),
        ('{"name": "calc", "arguments": [1]}', '"arguments" must be an object'),
        ('{"name": "calc", "arguments": "x=1"}', "is a string that is not JSON"),
    ],
)
def test_bad_calls_are_returned_with_the_reason(body, why):
    (call,) = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert call.error is not None and why in call.error and body[:20] in call.error


def test_no_call_and_unclosed_call_are_answers():
    assert parse_tool_calls("The answer is 5") == []
    assert parse_tool_calls('<tool_call>{"name": "calc"') == []


def test_unknown_format_is_an_error():
    with pytest.raises(ValueError, match="agent.tool_call_format"):
        parse_tool_calls("", format="json")

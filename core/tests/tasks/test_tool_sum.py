"""The built-in task ``tool_sum``: its reward on the final turn, its splits, its few-shot prompt, and its
recipe through the real config loader."""

import asyncio

import pytest
from rlcore.agents.tool_calls import ToolCall, parse_tool_calls
from rlcore.agents.tools import build_tools, call_tool
from rlcore.config import load_config
from rlcore.plugins import registry
from rlcore.tasks import tool_sum


@pytest.mark.parametrize(
    ("final", "expected"),
    [
        ("13854", 1.0),
        (" The sum is 13854.\n", 1.0),
        ("13855", 0.0),
        ("13854 is wrong, it is 13855", 0.0),
        ('<tool_call>{"name": "calculator", "arguments": {"expression": "4821 + 9033"}}</tool_call>', 0.0),
        ("", 0.0),
    ],
)
def test_the_last_integer_of_the_final_turn_must_be_the_sum(final, expected):
    info = {"agent": {"final_text": final, "tool_calls": 1, "tool_errors": 0}}
    assert (
        tool_sum.compute_score(tool_sum.DATA_SOURCE, "13854 anywhere in the episode", "13854", info)
        == expected
    )


def test_the_reward_is_registered_and_reads_the_whole_response_without_agent_info():
    assert registry("reward_functions").get(tool_sum.DATA_SOURCE) is tool_sum.compute_score
    assert tool_sum.compute_score(tool_sum.DATA_SOURCE, "it is 13854", "13854", {"index": 0}) == 1.0


def test_splits_are_disjoint_four_digit_problems_without_the_worked_example():
    train, val = tool_sum.problems("train"), tool_sum.problems("val")
    assert (len(train), len(val)) == (tool_sum.SIZES["train"], tool_sum.SIZES["val"])
    assert all(1000 <= x <= 9999 for pair in train + val for x in pair)
    assert not set(train) & set(val)
    assert tool_sum.EXAMPLE not in set(train) | set(val)
    assert tool_sum.problems("val") == val  # a pure function of the split
    with pytest.raises(ValueError, match="no split 'sft'"):
        tool_sum.problems("sft")


def test_the_worked_example_is_a_solving_episode_the_calculator_answers():
    row = tool_sum.rows("val")[3]
    a, b = row["extra_info"]["a"], row["extra_info"]["b"]
    system, question, call, result, answer, ask = row["prompt"]
    assert [m["role"] for m in row["prompt"]] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert ask["content"] == f"Add the numbers:\n{a} + {b}" and row["reward_model"]["ground_truth"] == str(
        a + b
    )
    x, y = tool_sum.EXAMPLE
    (parsed,) = parse_tool_calls(call["content"])
    assert parsed == ToolCall("calculator", {"expression": f"{x} + {y}"})
    # What the built-in calculator replies to the example's call is the tool message and the answer.
    reply = asyncio.run(call_tool(build_tools(["calculator"]), parsed))
    assert reply.text == result["content"] == answer["content"] == str(x + y)
    assert "<tool_call>" in system["content"] and question["content"] == f"Add the numbers:\n{x} + {y}"


def test_the_recipe_trains_the_real_model_with_the_calculator():
    config = load_config(overrides=["data.train_files=[builtin:tool_sum/train.jsonl]"])
    assert config.model.path == "builtin:smollm2-135m-instruct"
    assert config.agent.enabled and config.agent.tools == ["calculator"]
    assert config.data.val_files == ["builtin:tool_sum/val.jsonl"]
    assert config.trainer.warmup_sft_steps == 0  # the worked example in the prompt is the only warm-up

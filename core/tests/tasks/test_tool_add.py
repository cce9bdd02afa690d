"""The built-in task ``tool_add``: its reward levels, its splits, the token-for-token copies it asks for,
and its files and recipe through the real loaders."""

import pytest
from rlcore.agents.tool_calls import ToolCall, parse_tool_calls
from rlcore.config import load_config
from rlcore.plugins import registry
from rlcore.tasks import tool_add, write_split
from rlcore.testing.tiny import build_tiny_tokenizer
from rlcore.trainer.sft import load_sft_examples


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.mark.parametrize(
    ("final", "calls", "errors", "expected"),
    [
        ("13854", 1, 0, 1.0),
        (" 13854\n", 0, 0, 1.0),
        ("13855", 1, 0, tool_add.CALL_CREDIT),
        ("13855", 2, 1, 0.0),
        ("13855", 0, 0, 0.0),
    ],
)
def test_reward_levels(final, calls, errors, expected):
    info = {"agent": {"final_text": final, "tool_calls": calls, "tool_errors": errors}}
    assert tool_add.compute_score(tool_add.DATA_SOURCE, "whole episode", "13854", info) == expected


def test_without_agent_info_the_whole_response_is_the_answer():
    assert tool_add.compute_score(tool_add.DATA_SOURCE, "13854", "13854", {"index": 0}) == 1.0
    assert registry("reward_functions").get(tool_add.DATA_SOURCE) is tool_add.compute_score


def test_splits_are_four_digit_problems_that_do_not_overlap():
    splits = {s: tool_add.problems(s) for s in tool_add.SPLITS}
    assert {s: len(p) for s, p in splits.items()} == tool_add.SIZES
    assert all(1000 <= x <= 9999 for p in splits.values() for pair in p for x in pair)
    assert not set(splits["val"]) & (set(splits["train"]) | set(splits["sft"]))
    with pytest.raises(ValueError, match="no split 'test'"):
        tool_add.problems("test")


def test_copies_are_token_for_token(tokenizer):
    for a, b in tool_add.problems("train")[:50]:
        prompt = tokenizer.tokenize(tool_add.request(a, b))
        expression = tokenizer.tokenize(f"{a} + {b}")
        call = tokenizer.tokenize(tool_add.call(a, b))
        assert _contains(prompt, expression) and _contains(call, expression)
        episode = tokenizer.tokenize(tool_add.episode_text(a, b))
        answer = tokenizer.tokenize(str(a + b))
        assert episode[-len(answer) :] == answer
        reply = episode.index("<|im_start|>", len(call)) + 4  # past <|im_start|> "to" "ol" "\n"
        assert episode[reply : reply + len(answer)] == answer


def _contains(seq, sub):
    return any(seq[i : i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def test_sft_episodes_solve_their_problem_and_fit_the_recipe(tmp_path, tokenizer):
    path = write_split("tool_add", "sft", tmp_path)
    limit = tool_add.RECIPE["sft"]["max_response_length"]
    examples = load_sft_examples([path], tokenizer, max_prompt_length=32, max_response_length=limit)
    assert len(examples) == tool_add.SIZES["sft"]
    for (a, b), row in zip(tool_add.problems("sft")[:20], tool_add.rows("sft")[:20], strict=True):
        (call,) = parse_tool_calls(row["response"])
        assert call == ToolCall("calculator", {"expression": f"{a} + {b}"})
        assert row["response"].endswith(str(a + b))
    python = parse_tool_calls(tool_add.episode_text(12, 34, "python"))
    assert python == [ToolCall("python", {"code": "print(12 + 34)"})]
    # The whole episode fits the response budget of the run.
    assert max(len(e.response_ids) for e in examples) <= tool_add.RECIPE["rollout"]["max_response_length"]


def test_recipe_turns_the_agent_on(tmp_path):
    config = load_config(overrides=["data.train_files=[builtin:tool_add/train.jsonl]"])
    assert config.agent.enabled and config.agent.tools == ["calculator", "python"]
    assert config.data.val_files == ["builtin:tool_add/val.jsonl"]
    assert config.sft.files == ["builtin:tool_add/sft.jsonl"]
    assert config.trainer.warmup_sft_steps == tool_add.RECIPE["trainer"]["warmup_sft_steps"]

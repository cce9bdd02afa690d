"""Observation deltas under a Qwen2.5-style template (tool results grouped into one user turn of
``<tool_response>`` blocks, a default system message): the delta is what the template adds after the
model's turn, whatever the template does before it."""

import pytest
from rlcore.agents.observations import Observations
from rlcore.agents.tools import ToolResult
from rlcore.testing.tiny import build_tiny_tokenizer

#: The parts of Qwen2.5-Instruct's chat template that decide how turns and tool results are rendered.
QWEN25_LIKE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="module")
def qwen_tokenizer():
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = QWEN25_LIKE
    return tokenizer


def test_two_results_of_one_turn_share_one_user_turn(qwen_tokenizer):
    obs = Observations(qwen_tokenizer, 64)
    messages = [obs.message(ToolResult("calculator", "5")), obs.message(ToolResult("python", "6\n"))]
    ids = obs.ids(messages, [17, qwen_tokenizer.eos_token_id])
    assert qwen_tokenizer.decode(ids) == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n6\n\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )


def test_the_delta_is_the_suffix_of_the_whole_rendering(qwen_tokenizer):
    """Rendering the whole conversation at once gives the same text as the prompt, the model's turn and
    the delta one after the other (the delta is exact, not an approximation of the template)."""
    obs = Observations(qwen_tokenizer, 64)
    user = {"role": "user", "content": "Add 2 and 3"}
    turn = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
    prompt = qwen_tokenizer.apply_chat_template([user], add_generation_prompt=True, tokenize=False)
    result = obs.message(ToolResult("calculator", "5"))
    turn_ids = [*qwen_tokenizer.encode(turn, add_special_tokens=False), qwen_tokenizer.eos_token_id]
    pieces = prompt + qwen_tokenizer.decode(turn_ids) + qwen_tokenizer.decode(obs.ids([result], turn_ids))
    whole = qwen_tokenizer.apply_chat_template(
        [user, {"role": "assistant", "content": turn}, result], add_generation_prompt=True, tokenize=False
    )
    assert pieces == whole


def test_a_template_that_rewrites_history_is_refused(qwen_tokenizer):
    tokenizer = build_tiny_tokenizer()
    # Drops every assistant message once a tool message follows (as some templates do with reasoning).
    tokenizer.chat_template = (
        "{%- set has_tool = messages | selectattr('role', 'equalto', 'tool') | list | length > 0 %}"
        "{%- for m in messages %}{%- if not (has_tool and m.role == 'assistant') %}"
        "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    obs = Observations(tokenizer, 64)
    with pytest.raises(ValueError, match="renders the earlier messages differently"):
        obs.ids([obs.message(ToolResult("calculator", "5"))], [tokenizer.eos_token_id])

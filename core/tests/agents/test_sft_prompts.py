"""An agent run's warm-up prompts are rendered as its RL prompts are: with the tools offered."""

import json

from rlcore.agents import AgentConfig
from rlcore.agents.config import data_with_tools
from rlcore.data import DataConfig, RLDataset
from rlcore.testing.tiny import build_tiny_tokenizer
from rlcore.trainer.sft import load_sft_examples

TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t['function']['name'] }}\n{% endfor %}<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_warm_up_and_rl_prompts_are_the_same_ids(tmp_path):
    tokenizer = build_tiny_tokenizer()  # its own: the template is replaced
    tokenizer.chat_template = TEMPLATE
    row = {"prompt": [{"role": "user", "content": "Add the numbers:\n12 + 34"}], "response": "46"}
    path = tmp_path / "sft.jsonl"
    path.write_text(json.dumps({**row, "data_source": "x", "reward_model": {"ground_truth": "46"}}) + "\n")
    data = data_with_tools(
        DataConfig(train_files=[str(path)]), AgentConfig(enabled=True, tools=["calculator"])
    )
    (example,) = load_sft_examples([path], tokenizer, chat_template_kwargs=data.apply_chat_template_kwargs)
    rl = RLDataset([str(path)], tokenizer, data)[0]["input_ids"].tolist()
    assert example.prompt_ids == rl
    assert tokenizer.decode(rl).startswith("<|im_start|>system\ncalculator\n")
    (plain,) = load_sft_examples([path], tokenizer)
    assert "calculator" not in tokenizer.decode(plain.prompt_ids)

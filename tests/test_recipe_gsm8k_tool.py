"""The GSM8K-with-a-Python-interpreter recipe (recipes/gsm8k_tool/): its preprocessing on local rows in
GSM8K's raw format, the rows through rlcore's data pipeline with the tool offered to a tool-aware chat
template, an episode's text through the GSM8K scorer, and the recipe config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "gsm8k_tool"
CONFIG = RECIPE / "qwen2.5-0.5b-grpo-python.yaml"

RAW = [
    {
        "question": "Mia reads 30 pages a day for 4 days. How many pages does she read?",
        "answer": "30 * 4 = <<30*4=120>>120\n#### 120",
    },
    {
        "question": "A rope 7.5 meters long is cut in half. How long is each piece?",
        "answer": "7.5 / 2 = 3.75\n#### 3.75",
    },
    {"question": "There are 6 boxes with 9 pens each. How many pens?", "answer": "6 * 9 = 54\n#### 54"},
]

#: A Qwen-like template that renders ``tools=`` into the system prompt and tool messages as
#: ``<tool_response>`` blocks, as Qwen2.5's does (the tiny model's template ignores tools).
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{{ messages[0]['content'] if messages[0]['role'] == 'system' else '' }}"
    "\n# Tools\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% for message in messages %}{% if message['role'] == 'system' and tools %}{% elif message['role'] == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ message['content'] }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("gsm8k_tool")
    train = work / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in RAW))
    out = work / "data"
    proc = subprocess.run(
        [
            sys.executable,
            str(RECIPE / "preprocess.py"),
            "--local-dir",
            str(out),
            "--input-jsonl",
            f"train={train}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "train: 3 rows" in proc.stdout
    return out


def test_rows_have_the_tool_system_message_and_the_bare_question(prepared):
    import pyarrow.parquet as pq

    rows = pq.read_table(prepared / "train.parquet").to_pylist()
    for row, raw, final in zip(rows, RAW, ["120", "3.75", "54"], strict=True):
        system, user = row["prompt"]
        assert (
            system["role"] == "system" and "python tool" in system["content"] and "####" in system["content"]
        )
        assert user == {"role": "user", "content": raw["question"]}
        assert row["data_source"] == "openai/gsm8k" and row["reward_model"]["ground_truth"] == final
        assert row["ability"] == "math_tool"


def test_prompts_offer_the_tool_and_an_episode_scores(prepared):
    from rlcore.agents import AgentConfig
    from rlcore.agents.config import data_with_tools
    from rlcore.data import DataConfig, RLDataset
    from rlcore.rewards.gsm8k import compute_score
    from rlcore.testing.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = TOOL_TEMPLATE
    data = DataConfig(train_files=[str(prepared / "train.parquet")], max_prompt_length=4096)
    data = data_with_tools(data, AgentConfig(enabled=True, tools=["python"]))
    dataset = RLDataset(data.train_files, tokenizer, data)
    text = tokenizer.decode(dataset[0]["input_ids"].tolist())
    assert (
        '"name": "python"' in text
        and "You are a careful math assistant" in text
        and RAW[0]["question"] in text
    )
    episode = (
        '<tool_call>{"name": "python", "arguments": {"code": "print(30 * 4)"}}</tool_call>\n'
        "user\n<tool_response>\n120\n</tool_response>\nassistant\nShe reads 120 pages.\n#### 120"
    )
    assert compute_score("openai/gsm8k", episode, "120") == 1.0
    assert compute_score("openai/gsm8k", episode.replace("#### 120", "#### 12"), "120") == 0.0


def test_recipe_config_validates():
    from rlcore.config import load_config

    config = load_config(CONFIG)
    assert config.agent.enabled and config.agent.tools == ["python"]
    assert config.rollout.max_response_length >= 1024 and config.algorithm.loss_agg_mode == "token-mean"
    assert config.data.train_files == ["data/gsm8k_tool/train.parquet"]
    text = CONFIG.read_text()
    assert (
        "recipes/gsm8k_tool/preprocess.py" in text
        and "rlcore train --config " + str(CONFIG.relative_to(ROOT)) in text
    )

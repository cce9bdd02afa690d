"""The built-in task: its data (verl's schema, loadable by the prompt pipeline), its reward function
(registered by data source), its ``builtin:`` file names, and the config layer that makes
``rlcore train`` with no arguments run it."""

from __future__ import annotations

import json

import pytest
from rlcore.config import ConfigError, load_config
from rlcore.data import DataConfig, build_train_loader, build_val_loader
from rlcore.rewards.functions import reward_function_for
from rlcore.tasks import copy_word, parse_builtin, resolve_files, task_of, with_task_recipe


@pytest.fixture(scope="module")
def tokenizer():
    from rlcore.testing.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.mark.parametrize(
    ("response", "expected"),
    [("apple", 1.0), (" apple\n", 1.0), ("apple.", 0.0), ("Apple", 0.0), ("apple apple", 0.0), ("", 0.0)],
)
def test_reward_is_exact_match_after_stripping_white_space(response, expected):
    assert copy_word.compute_score("rlcore/copy_word", response, "apple") == expected


def test_reward_function_is_registered_by_data_source():
    score = reward_function_for(copy_word.DATA_SOURCE)
    assert score(data_source=copy_word.DATA_SOURCE, solution_str="banana", ground_truth="banana") == 1.0
    assert score(data_source=copy_word.DATA_SOURCE, solution_str="cherry", ground_truth="banana") == 0.0


def test_prompts_cover_every_template_and_word_once():
    pairs = copy_word.prompts()
    assert len(pairs) == len(set(pairs)) == 64
    assert ("Say apple", "apple") in pairs and ("Answer with sort", "sort") in pairs
    for request, word in pairs:
        assert request.endswith(" " + word)


def test_every_word_is_one_token_with_and_without_a_leading_space(tokenizer):
    # The task's premise: an answer is one token, and the prompt holds the word as one other token.
    for word in copy_word.WORDS:
        assert len(tokenizer(word, add_special_tokens=False)["input_ids"]) == 1, word
        assert len(tokenizer(" " + word, add_special_tokens=False)["input_ids"]) == 1, word


def test_builtin_files_load_through_the_prompt_pipeline(tmp_path, tokenizer):
    train, val, sft = resolve_files(
        ["builtin:copy_word/train.jsonl", "builtin:copy_word/val.jsonl", "builtin:copy_word/sft.jsonl"],
        tmp_path,
    )
    assert train == str(tmp_path / "copy_word" / "train.jsonl")
    config = DataConfig(train_files=[train], val_files=[val], train_batch_size=16, max_prompt_length=32)
    loader = build_train_loader(config, tokenizer)
    batch = next(iter(loader))
    assert batch["prompts"].shape[0] == 16 and set(batch["data_source"]) == {"rlcore/copy_word"}
    text = tokenizer.decode(batch["prompts"][0][batch["prompt_mask"][0].bool()])
    word = batch["ground_truth"][0]
    assert text.startswith("<|im_start|>user\n") and text.endswith(
        f" {word}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert len(build_val_loader(config, tokenizer).dataset) == 64
    rows = [json.loads(line) for line in open(sft)]
    assert all(r["response"] == r["reward_model"]["ground_truth"] for r in rows) and len(rows) == 64
    # A user's file passes through untouched; writing again gives the same bytes.
    before = (tmp_path / "copy_word" / "val.jsonl").read_bytes()
    assert resolve_files(["mine.jsonl", "builtin:copy_word/val.jsonl"], tmp_path) == ["mine.jsonl", val]
    assert (tmp_path / "copy_word" / "val.jsonl").read_bytes() == before


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("builtin:nosuch/train.jsonl", "unknown built-in task 'nosuch'; built-in tasks: addition, copy_word"),
        ("builtin:copy_word/test.jsonl", "has no split 'test'"),
        ("builtin:copy_word", "write builtin:<task>/<split>.jsonl"),
        ("builtin:copy_word/train.parquet", "write builtin:<task>/<split>.jsonl"),
    ],
)
def test_bad_builtin_names_say_what_exists(path, message):
    with pytest.raises(ValueError) as info:
        parse_builtin(path)
    assert message in str(info.value)


def test_task_of_a_raw_config():
    assert task_of({}) == "copy_word"
    assert task_of({"data": {"train_files": []}}) == "copy_word"
    assert task_of({"data": {"train_files": ["builtin:copy_word/train.jsonl"]}}) == "copy_word"
    assert task_of({"data": {"train_files": "mine.parquet"}}) is None
    assert task_of({"data": {"train_files": ["builtin:copy_word/train.jsonl", "mine.jsonl"]}}) is None


def test_recipe_layer_lies_under_the_users_settings():
    raw = {"trainer": {"total_steps": 3}, "actor": {"optim": {"weight_decay": 0.1}}}
    merged = with_task_recipe(raw)
    assert merged["trainer"]["total_steps"] == 3
    assert merged["trainer"]["warmup_sft_steps"] == copy_word.RECIPE["trainer"]["warmup_sft_steps"]
    assert merged["actor"]["optim"] == {"lr": copy_word.RECIPE["actor"]["optim"]["lr"], "weight_decay": 0.1}
    assert merged["sft"]["files"] == ["builtin:copy_word/sft.jsonl"]
    assert raw == {"trainer": {"total_steps": 3}, "actor": {"optim": {"weight_decay": 0.1}}}  # not mutated
    assert with_task_recipe({"data": {"train_files": ["x.jsonl"]}}) == {"data": {"train_files": ["x.jsonl"]}}


def test_load_config_without_data_runs_the_builtin_task_and_with_data_does_not(tmp_path):
    config = load_config()
    assert config.data.train_files == ["builtin:copy_word/train.jsonl"]
    assert config.data.val_files == ["builtin:copy_word/val.jsonl"]
    assert config.model.path == "builtin:tiny"
    assert config.actor.optim.lr == copy_word.RECIPE["actor"]["optim"]["lr"]
    assert config.trainer.warmup_sft_steps == copy_word.RECIPE["trainer"]["warmup_sft_steps"]
    assert load_config(overrides=["actor.optim.lr=0.01"]).actor.optim.lr == 0.01

    users = load_config(overrides=[f"data.train_files=[{tmp_path / 'train.parquet'}]"])
    assert users.actor.optim.lr == 1e-6 and users.trainer.warmup_sft_steps == 0 and users.sft.files == []
    assert users.data.val_files == []


def test_sft_section_is_validated():
    with pytest.raises(ConfigError, match="sft.files"):
        load_config(overrides=["sft.files=[answers.csv]"])
    with pytest.raises(ConfigError, match="trainer.warmup_sft_steps"):
        load_config(overrides=["trainer.warmup_sft_steps=-1"])

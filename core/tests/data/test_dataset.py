"""RLDataset: schema loading, chat template, filtering and truncation, checked against the tokenizer."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from rlcore.data import DataConfig, DataError, RLDataset, truncate


def reference_ids(tokenizer, messages) -> list[int]:
    """Token ids as transformers' own tokenizing chat-template path produces them."""
    return list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    )


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_loads_verl_schema(tokenizer, write, rows, suffix):
    data = rows(5)
    ds = RLDataset([write("train" + suffix, data)], tokenizer, DataConfig())
    assert len(ds) == 5
    for i, row in enumerate(data):
        item = ds[i]
        assert item["input_ids"].dtype == np.int32
        assert item["input_ids"].tolist() == reference_ids(tokenizer, row["prompt"])
        assert item["raw_prompt"] == row["prompt"]
        assert item["data_source"] == "openai/gsm8k"
        assert item["ground_truth"] == str(2 * i)
        assert item["reward_model"] == {"style": "rule", "ground_truth": str(2 * i)}
        assert item["extra_info"] == {"split": "train", "index": i}
        assert item["ability"] == "math"  # extra columns travel along
        assert item["index"] == i


def test_chat_template_is_applied(tokenizer, write, rows):
    ds = RLDataset([write("t.jsonl", rows(2))], tokenizer, DataConfig())
    text = tokenizer.decode(ds[1]["input_ids"].tolist())
    assert text == "<|im_start|>user\nWhat is 1 + 1?<|im_end|>\n<|im_start|>assistant\n"


def test_chat_template_kwargs_reach_the_template(tokenizer, write, rows):
    tok = tokenizer.__class__(tokenizer_object=tokenizer.backend_tokenizer, pad_token="<|endoftext|>")
    tok.chat_template = "{% if terse %}T:{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    path = write("k.jsonl", rows(1))
    plain = RLDataset([path], tok, DataConfig())
    terse = RLDataset([path], tok, DataConfig(apply_chat_template_kwargs={"terse": True}))
    assert tok.decode(plain[0]["input_ids"].tolist()) == "What is 0 + 0?"
    assert tok.decode(terse[0]["input_ids"].tolist()) == "T:What is 0 + 0?"


def test_raw_text_mode(tokenizer, write, rows):
    data = rows(2)
    data[1]["prompt"] = "Just text: 7 + 8 ="
    data[0]["prompt"] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}]
    ds = RLDataset([write("raw.jsonl", data)], tokenizer, DataConfig(apply_chat_template=False))
    assert ds[0]["input_ids"].tolist() == tokenizer("Be brief.\n2 + 2?")["input_ids"]
    assert ds[1]["input_ids"].tolist() == tokenizer("Just text: 7 + 8 =")["input_ids"]
    assert ds[1]["raw_prompt"] == "Just text: 7 + 8 ="


def test_rows_of_several_files_are_concatenated(tokenizer, write, rows):
    a = write("a.parquet", rows(3))
    b = write("b.jsonl", rows(2))
    ds = RLDataset([a, b], tokenizer, DataConfig())
    assert len(ds) == 5
    assert [ds[i]["index"] for i in range(5)] == [0, 1, 2, 3, 4]
    assert ds[4]["ground_truth"] == "2"  # row 1 of b.jsonl
    assert ds.where(1) == f"file {a!r}, row 1"
    assert ds.where(4) == f"file {b!r}, row 1 (line 2)"


def long_rows(rows, lengths_words):
    data = rows(len(lengths_words))
    for r, n in zip(data, lengths_words, strict=True):
        r["prompt"] = [{"role": "user", "content": " ".join(["apple"] * n)}]
    return data


def test_filter_overlong_prompts_counts_and_logs(tokenizer, write, rows, caplog):
    data = long_rows(rows, [1, 40, 2, 60, 3])
    lengths = [len(reference_ids(tokenizer, r["prompt"])) for r in data]
    limit = 30
    expected_kept = [i for i, n in enumerate(lengths) if n <= limit]
    assert expected_kept == [0, 2, 4]  # the test's premise: rows 1 and 3 are too long
    with caplog.at_level(logging.INFO, logger="rlcore.data.dataset"):
        ds = RLDataset([write("f.parquet", data)], tokenizer, DataConfig(max_prompt_length=limit))
    assert ds.num_filtered == 2
    assert len(ds) == 3
    assert [ds[i]["index"] for i in range(3)] == expected_kept
    assert "dropped 2 of 5 prompts longer than data.max_prompt_length=30 tokens" in caplog.text


def test_all_prompts_filtered_is_an_error(tokenizer, write, rows):
    path = write("all.jsonl", long_rows(rows, [50, 50]))
    with pytest.raises(
        DataError, match=r"every one of the 2 prompts .* longer than data\.max_prompt_length=10"
    ):
        RLDataset([path], tokenizer, DataConfig(max_prompt_length=10))


def test_truncation_error_names_row_length_and_fixes(tokenizer, write, rows):
    data = long_rows(rows, [1, 2, 40])
    n = len(reference_ids(tokenizer, data[2]["prompt"]))
    path = write("e.jsonl", data)
    config = DataConfig(max_prompt_length=20, filter_overlong_prompts=False, truncation="error")
    with pytest.raises(DataError) as info:
        RLDataset([path], tokenizer, config)
    message = str(info.value)
    assert (
        f"e.jsonl', row 2 (line 3): the prompt is {n} tokens long, over data.max_prompt_length=20" in message
    )
    assert "Raise data.max_prompt_length, set data.truncation to left/right/middle" in message
    assert "data.filter_overlong_prompts=true" in message


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_truncation_modes_on_a_known_prompt(tokenizer, write, rows, mode):
    data = long_rows(rows, [1, 40])
    full = reference_ids(tokenizer, data[1]["prompt"])
    limit = 15
    expected = {
        "left": full[-limit:],
        "right": full[:limit],
        "middle": full[:7] + full[-8:],
    }[mode]
    config = DataConfig(max_prompt_length=limit, filter_overlong_prompts=False, truncation=mode)
    ds = RLDataset([write("t.jsonl", data)], tokenizer, config)
    assert ds.num_truncated == 1
    assert ds[1]["input_ids"].tolist() == expected
    assert ds[0]["input_ids"].tolist() == reference_ids(tokenizer, data[0]["prompt"])


def test_truncate_by_hand():
    ids = np.arange(10)
    assert truncate(ids, 4, "left").tolist() == [6, 7, 8, 9]
    assert truncate(ids, 4, "right").tolist() == [0, 1, 2, 3]
    assert truncate(ids, 4, "middle").tolist() == [0, 1, 8, 9]
    assert truncate(ids, 5, "middle").tolist() == [0, 1, 7, 8, 9]
    assert truncate(ids, 10, "error").tolist() == list(range(10))


def test_reserved_column_names_are_not_carried(tokenizer, write, rows, caplog):
    data = rows(2)
    for r in data:
        r["index"] = "mine"
    with caplog.at_level(logging.WARNING, logger="rlcore.data.dataset"):
        ds = RLDataset([write("r.jsonl", data)], tokenizer, DataConfig())
    assert ds[1]["index"] == 1
    assert "columns ['index'] are not carried into batches" in caplog.text


def test_pad_falls_back_to_eos(tokenizer, write, rows):
    tok = tokenizer.__class__(tokenizer_object=tokenizer.backend_tokenizer, eos_token="<|im_end|>")
    tok.chat_template = tokenizer.chat_template
    assert tok.pad_token_id is None
    ds = RLDataset([write("p.jsonl", rows(1))], tok, DataConfig())
    assert ds.pad_token_id == tok.eos_token_id

"""Bad data files and rows fail with messages naming the file, row and column and saying what to do."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rlcore.data import DataConfig, DataError, RLDataset


def load(files, tokenizer, **config):
    return RLDataset(files, tokenizer, DataConfig(**config))


def test_nonexistent_path(tokenizer, tmp_path):
    missing = tmp_path / "nope.parquet"
    with pytest.raises(DataError, match=r"nope\.parquet' does not exist.*data\.train_files"):
        load([str(missing)], tokenizer)


def test_no_files(tokenizer):
    with pytest.raises(DataError, match=r"no train data files given: set data\.train_files"):
        load([], tokenizer)


def test_unsupported_suffix(tokenizer, tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("a,b\n")
    with pytest.raises(DataError, match=r"unsupported suffix '\.csv'.*\.parquet, \.jsonl, \.json"):
        load([str(path)], tokenizer)


def test_empty_jsonl(tokenizer, tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(DataError, match=r"empty\.jsonl' has no rows"):
        load([str(path)], tokenizer)


def test_empty_parquet(tokenizer, tmp_path, rows):
    path = tmp_path / "empty.parquet"
    table = pa.Table.from_pylist(rows(1))
    pq.write_table(table.slice(0, 0), path)
    with pytest.raises(DataError, match=r"empty\.parquet' has no rows"):
        load([str(path)], tokenizer)


def test_corrupt_parquet(tokenizer, tmp_path, write, rows):
    good = write("good.parquet", rows(4))
    path = tmp_path / "broken.parquet"
    path.write_bytes(open(good, "rb").read()[:-40])  # an interrupted download
    with pytest.raises(DataError, match=r"broken\.parquet' is not a readable parquet file.*regenerate it"):
        load([str(path)], tokenizer)


def test_text_named_parquet(tokenizer, tmp_path):
    path = tmp_path / "text.parquet"
    path.write_text('{"prompt": "not parquet"}\n')
    with pytest.raises(DataError, match=r"text\.parquet' is not a readable parquet file"):
        load([str(path)], tokenizer)


def test_bad_json_line_names_line_number(tokenizer, tmp_path, rows):
    lines = [json.dumps(r) for r in rows(3)]
    lines.insert(2, '{"prompt": [}')
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"bad\.jsonl', line 3: not valid JSON"):
        load([str(path)], tokenizer)


def test_json_line_not_an_object(tokenizer, tmp_path, rows):
    path = tmp_path / "list.jsonl"
    path.write_text(json.dumps(rows(1)[0]) + "\n[1, 2]\n")
    with pytest.raises(
        DataError, match=r"list\.jsonl', line 2: expected a JSON object \(one row\), got list"
    ):
        load([str(path)], tokenizer)


def test_missing_column_parquet_lists_present_ones(tokenizer, write, rows):
    data = rows(3)
    for r in data:
        del r["reward_model"]
    path = write("x.parquet", data)
    with pytest.raises(DataError) as info:
        load([path], tokenizer)
    message = str(info.value)
    assert "x.parquet' has no column 'reward_model'" in message
    assert "columns present: ['ability', 'data_source', 'extra_info', 'prompt']" in message


def test_missing_prompt_column_suggests_prompt_key(tokenizer, write, rows):
    data = [{("question" if k == "prompt" else k): v for k, v in r.items()} for r in rows(2)]
    path = write("q.parquet", data)
    with pytest.raises(DataError, match=r"no column 'prompt'.*set data\.prompt_key"):
        load([path], tokenizer)
    assert len(load([path], tokenizer, prompt_key="question")) == 2


def test_missing_key_in_jsonl_row_names_line(tokenizer, write, rows):
    data = rows(4)
    del data[2]["data_source"]
    path = write("y.jsonl", data)
    with pytest.raises(
        DataError, match=r"y\.jsonl', row 2 \(line 3\) has no key 'data_source' \(keys present: \["
    ):
        load([path], tokenizer)


def test_prompt_string_is_not_messages(tokenizer, write, rows):
    data = rows(3)
    data[1]["prompt"] = "What is 1 + 1?"
    path = write("s.jsonl", data)
    with pytest.raises(
        DataError,
        match=r"s\.jsonl', row 1 \(line 2\), column 'prompt': expected a list of chat messages.*"
        r"data\.apply_chat_template=false",
    ):
        load([path], tokenizer)


@pytest.mark.parametrize(
    "prompt, detail",
    [
        ([], r"expected a non-empty list of chat messages"),
        ({"role": "user", "content": "hi"}, r"expected a non-empty list of chat messages .* got dict"),
        (["hi"], r"message 0: expected a dict with a string 'role' and a 'content'"),
        (
            [{"role": "user", "content": "a"}, {"content": "b"}],
            r"message 1: expected a dict with a string 'role'",
        ),
    ],
)
def test_malformed_messages(tokenizer, write, rows, prompt, detail):
    data = rows(2)
    data[1]["prompt"] = prompt
    path = write("m.jsonl", data)
    with pytest.raises(DataError, match=r"m\.jsonl', row 1 \(line 2\), column 'prompt'.*" + detail):
        load([path], tokenizer)


def test_missing_ground_truth(tokenizer, write, rows):
    data = rows(3)
    data[2]["reward_model"] = {"style": "rule"}
    path = write("g.jsonl", data)
    with pytest.raises(
        DataError,
        match=r"g\.jsonl', row 2 \(line 3\), column 'reward_model': style 'rule' needs 'ground_truth'.*"
        r"Add reward_model\.ground_truth",
    ):
        load([path], tokenizer)


def test_missing_ground_truth_in_parquet_struct(tokenizer, write, rows):
    data = rows(3)
    data[1]["reward_model"] = {"style": "rule", "ground_truth": None}
    path = write("g.parquet", data)
    with pytest.raises(DataError, match=r"g\.parquet', row 1, column 'reward_model': style 'rule' needs"):
        load([path], tokenizer)


def test_model_style_needs_no_ground_truth(tokenizer, write, rows):
    data = rows(2)
    for r in data:
        r["reward_model"] = {"style": "model"}
    ds = load([write("rm.jsonl", data)], tokenizer)
    assert ds[0]["ground_truth"] is None


def test_reward_model_not_a_dict(tokenizer, write, rows):
    data = rows(2)
    data[0]["reward_model"] = "42"
    with pytest.raises(DataError, match=r"row 0 \(line 1\), column 'reward_model': expected a dict like"):
        load([write("r.jsonl", data)], tokenizer)


def test_data_source_not_a_string(tokenizer, write, rows):
    data = rows(2)
    data[1]["data_source"] = None
    with pytest.raises(
        DataError, match=r"row 1 \(line 2\), column 'data_source': expected a non-empty string"
    ):
        load([write("d.jsonl", data)], tokenizer)


def test_extra_info_not_a_dict(tokenizer, write, rows):
    data = rows(2)
    data[1]["extra_info"] = [1, 2]
    with pytest.raises(
        DataError, match=r"row 1 \(line 2\), column 'extra_info': expected a dict \(or null\)"
    ):
        load([write("e.jsonl", data)], tokenizer)


def test_error_in_second_file_names_that_file_and_its_row(tokenizer, write, rows):
    first = write("a.jsonl", rows(3))
    data = rows(2)
    data[1]["prompt"] = 7
    second = write("b.jsonl", data)
    with pytest.raises(DataError, match=r"b\.jsonl', row 1 \(line 2\)"):
        load([first, second], tokenizer)


def test_tokenizer_without_chat_template(tokenizer, write, rows):
    bare = tokenizer.__class__(tokenizer_object=tokenizer.backend_tokenizer, pad_token="<|endoftext|>")
    bare.chat_template = None
    path = write("t.jsonl", rows(2))
    with pytest.raises(DataError, match=r"has no chat template.*data\.apply_chat_template=false"):
        load([path], bare)
    assert len(load([path], bare, apply_chat_template=False)) == 2


def test_chat_template_failure_names_row(tokenizer, write, rows):
    strict = tokenizer.__class__(tokenizer_object=tokenizer.backend_tokenizer, pad_token="<|endoftext|>")
    strict.chat_template = (
        "{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
        "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}{{ m['content'] }}{% endfor %}"
    )
    data = rows(3)
    data[2]["prompt"] = [{"role": "robot", "content": "beep"}]
    with pytest.raises(
        DataError,
        match=r"row 2 \(line 3\), column 'prompt': the tokenizer's chat template failed.*"
        r"unknown role robot",
    ):
        load([write("c.jsonl", data)], strict)


def test_config_rejects_bad_values():
    with pytest.raises(
        ValueError, match=r"data\.truncation must be one of error, left, right, middle; got 'both'"
    ):
        DataConfig(truncation="both")
    with pytest.raises(ValueError, match=r"data\.max_prompt_length must be a positive integer, got 0"):
        DataConfig(max_prompt_length=0)
    with pytest.raises(ValueError, match=r"data\.train_files must be a list of file paths, got 'a\.parquet'"):
        DataConfig(train_files="a.parquet")
    with pytest.raises(
        ValueError, match=r"data\.train_files looks like one path split into characters \('a\.parquet'\)"
    ):
        DataConfig(train_files=list("a.parquet"))
    with pytest.raises(
        ValueError, match=r"data\.val_files\[1\] = 'b\.csv' is not a \.parquet, \.jsonl, \.json file"
    ):
        DataConfig(val_files=["a.jsonl", "b.csv"])

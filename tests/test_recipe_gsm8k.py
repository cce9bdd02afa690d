"""The GSM8K recipe (recipes/gsm8k/): preprocessing a local file in GSM8K's raw format, loading the result
with rlcore's data pipeline, scoring it with the built-in GSM8K scorer, and validating the recipe config.

The fixture rows are written here in GSM8K's format (``{"question", "answer": "... #### N"}``); CI has
no hub, so the hub path of ``preprocess.py`` is not exercised.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "gsm8k"
CONFIG = RECIPE / "qwen2.5-0.5b-grpo.yaml"
RLCORE = shutil.which("rlcore") or str(Path(sys.executable).with_name("rlcore"))

#: Hand-written problems in GSM8K's raw format: worked solution with <<calculator>> notes, then "#### N".
RAW = [
    {
        "question": "A baker makes 12 loaves in the morning and 15 in the afternoon. He sells 20. "
        "How many loaves are left?",
        "answer": "He makes 12 + 15 = <<12+15=27>>27 loaves.\nHe has 27 - 20 = <<27-20=7>>7 left.\n#### 7",
    },
    {
        "question": "Mia reads 30 pages a day for 4 days. How many pages does she read?",
        "answer": "She reads 30 * 4 = <<30*4=120>>120 pages.\n#### 120",
    },
    {
        "question": "A farm has 300 cows and buys 4 times as many sheep. How many animals does it have?",
        "answer": "It buys 300 * 4 = <<300*4=1200>>1200 sheep.\n"
        "It has 300 + 1200 = <<300+1200=1500>>1,500 animals.\n#### 1,500",
    },
    {
        "question": "Tom had $5 and spent $8 on credit. What is his balance in dollars?",
        "answer": "His balance is 5 - 8 = <<5-8=-3>>-3 dollars.\n#### -3",
    },
    {
        "question": "A rope 7.5 meters long is cut in half. How long is each piece?",
        "answer": "Each piece is 7.5 / 2 = <<7.5/2=3.75>>3.75 meters.\n#### 3.75",
    },
    {
        "question": "There are 6 boxes with 9 pens each. 14 pens are given away. How many remain?",
        "answer": "There are 6 * 9 = <<6*9=54>>54 pens.\n54 - 14 = <<54-14=40>>40 remain.\n#### 40",
    },
]
#: The final answers, read off the rows above by hand.
FINAL = ["7", "120", "1500", "-3", "3.75", "40"]


def load_preprocess():
    spec = importlib.util.spec_from_file_location("gsm8k_preprocess", RECIPE / "preprocess.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_raw(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """The recipe's preprocessing run as a user runs it (a subprocess), on the fixture rows."""
    work = tmp_path_factory.mktemp("gsm8k")
    train = write_raw(work / "train.jsonl", RAW[:4])
    test = write_raw(work / "test.jsonl", RAW[4:])
    out = work / "data"
    proc = subprocess.run(
        [
            sys.executable,
            str(RECIPE / "preprocess.py"),
            "--local-dir",
            str(out),
            "--input-jsonl",
            f"train={train}",
            "--input-jsonl",
            str(test),  # a bare path: the split is named by the file name
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "train: 4 rows" in proc.stdout and "test: 2 rows" in proc.stdout
    return out


def test_rows_follow_verls_schema(prepared):
    import pyarrow.parquet as pq

    rows = (
        pq.read_table(prepared / "train.parquet").to_pylist()
        + pq.read_table(prepared / "test.parquet").to_pylist()
    )
    assert len(rows) == len(RAW)
    for i, (row, raw, final) in enumerate(zip(rows, RAW, FINAL, strict=True)):
        split, index = ("train", i) if i < 4 else ("test", i - 4)
        assert row["data_source"] == "openai/gsm8k"
        assert row["prompt"] == [
            {
                "role": "user",
                "content": raw["question"]
                + ' Let\'s think step by step and output the final answer after "####".',
            }
        ]
        assert row["reward_model"] == {"style": "rule", "ground_truth": final}
        assert row["extra_info"] == {
            "split": split,
            "index": index,
            "answer": raw["answer"],
            "question": raw["question"],
        }
        assert row["ability"] == "math"


def test_rlcore_loads_the_files_and_scores_gold_solutions(prepared):
    from rlcore.data import DataConfig, RLDataset
    from rlcore.rewards import default_compute_score
    from rlcore.testing.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    config = DataConfig(
        train_files=[str(prepared / "train.parquet")], max_prompt_length=4096, filter_overlong_prompts=False
    )
    dataset = RLDataset([str(prepared / "train.parquet"), str(prepared / "test.parquet")], tokenizer, config)
    assert len(dataset) == len(RAW)
    for i, raw in enumerate(RAW):
        sample = dataset[i]
        assert sample["data_source"] == "openai/gsm8k"
        assert raw["question"] in tokenizer.decode(sample["input_ids"].tolist())
        # The reference solution scores 1; the same solution ending in another number scores 0.
        gold = raw["answer"]
        truth = sample["ground_truth"]
        assert default_compute_score(sample["data_source"], gold, truth, sample["extra_info"]) == 1.0
        wrong = gold.rpartition("#### ")[0] + "#### 999999"
        assert default_compute_score(sample["data_source"], wrong, truth, sample["extra_info"]) == 0.0


def test_bad_raw_rows_name_file_and_line(tmp_path):
    preprocess = load_preprocess()
    bad = tmp_path / "train.jsonl"
    bad.write_text(
        json.dumps(RAW[0]) + "\n\n" + json.dumps({"question": "q", "answer": "no final line"}) + "\n"
    )
    with pytest.raises(preprocess.PreprocessError, match=r"train.jsonl', line 3: the answer has no final"):
        preprocess.main(["--local-dir", str(tmp_path / "out"), "--input-jsonl", f"train={bad}"])
    bad.write_text(json.dumps({"problem": "q", "solution": "#### 1"}) + "\n")
    with pytest.raises(preprocess.PreprocessError, match=r"line 1: expected a string 'question'"):
        preprocess.main(["--local-dir", str(tmp_path / "out"), "--input-jsonl", f"train={bad}"])
    with pytest.raises(preprocess.PreprocessError, match="does not exist"):
        preprocess.main(["--input-jsonl", f"train={tmp_path / 'missing.jsonl'}"])


def test_extract_solution_matches_the_scorer():
    from rlcore.rewards.gsm8k import extract_answer

    preprocess = load_preprocess()
    for raw, final in zip(RAW, FINAL, strict=True):
        assert preprocess.extract_solution(raw["answer"]) == final
        assert extract_answer(raw["answer"]) == final  # what the scorer reads off a response
    assert preprocess.extract_solution("no answer here") is None


def test_recipe_config_validates():
    from rlcore.plugins import registry

    for key, name in (("train_engines", "fsdp"), ("rollout_engines", "vllm")):
        if name not in registry(key):
            pytest.skip(f"the recipe needs the {name!r} plugin, which is not installed")
    proc = subprocess.run(
        [RLCORE, "config", "--config", str(CONFIG), "--validate"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "config is valid"


def test_recipe_config_says_what_the_readme_says():
    from rlcore.config import load_config
    from rlcore.plugins import registry

    if "fsdp" not in registry("train_engines") or "vllm" not in registry("rollout_engines"):
        pytest.skip("the recipe needs the fsdp and vllm plugins")
    config = load_config(CONFIG)
    assert (config.engine, config.rollout.engine, config.algorithm.name) == ("fsdp", "vllm", "grpo")
    assert config.model.path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert (config.rollout.n, config.actor.optim.lr) == (5, 1e-6)
    assert (config.data.max_prompt_length, config.rollout.max_response_length) == (512, 512)
    algo = config.algorithm
    assert (algo.use_kl_loss, algo.kl_loss_type, algo.kl_loss_coef) == (True, "low_var_kl", 0.001)
    assert config.plugins["fsdp"].mixed_precision == "bfloat16"
    assert config.data.train_files == ["data/gsm8k/train.parquet"]
    # The prompts per step divide into whole mini-batches.
    assert config.data.train_batch_size % config.actor.ppo_mini_batch_size == 0

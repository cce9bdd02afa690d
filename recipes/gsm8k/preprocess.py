"""GSM8K -> prompt files in verl's schema (``train.parquet``, ``test.parquet``), as verl's own
``examples/data_preprocess/gsm8k.py`` writes them, so either tool reads the other's files.

From the Hugging Face hub (needs the ``datasets`` package and network)::

    python recipes/gsm8k/preprocess.py --local-dir data/gsm8k

From local files in GSM8K's raw format (one ``{"question": ..., "answer": "... #### 42"}`` per line, as in
the ``grade_school_math/data/*.jsonl`` files of github.com/openai/grade-school-math); no ``datasets``
needed::

    python recipes/gsm8k/preprocess.py --local-dir data/gsm8k \\
        --input-jsonl train=raw/train.jsonl --input-jsonl test=raw/test.jsonl

Each output row::

    data_source   "openai/gsm8k"                      (selects rlcore's built-in GSM8K scorer)
    prompt        [{"role": "user", "content": question + " " + INSTRUCTION}]
    ability       "math"
    reward_model  {"style": "rule", "ground_truth": "<the number after ####, commas removed>"}
    extra_info    {"split", "index", "answer", "question"}
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

DATA_SOURCE = "openai/gsm8k"
#: verl's instruction, so the model writes its final answer where the scorer looks (after "####").
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
_FINAL_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")


class PreprocessError(ValueError):
    """An input row or file could not be converted; the message names the file and line."""


def extract_solution(answer: str) -> str | None:
    """The final answer of a GSM8K solution (the number after ``####``, thousands separators removed),
    or ``None`` when the solution has no ``#### <number>`` line."""
    found = _FINAL_ANSWER.search(answer)
    return found.group(1).replace(",", "") if found else None


def make_row(example: dict[str, Any], split: str, index: int, where: str = "") -> dict[str, Any]:
    """One verl-schema row from a raw GSM8K example (``question``, ``answer``)."""
    where = where or f"{split} example {index}"
    for key in ("question", "answer"):
        if not isinstance(example.get(key), str):
            raise PreprocessError(
                f"{where}: expected a string {key!r} (GSM8K rows look like "
                f'{{"question": "...", "answer": "... #### 42"}}), got keys {sorted(example)}'
            )
    question, answer = example["question"], example["answer"]
    solution = extract_solution(answer)
    if solution is None:
        raise PreprocessError(f"{where}: the answer has no final '#### <number>' line: {answer[-80:]!r}")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": solution},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def read_jsonl(path: str | Path) -> list[tuple[dict[str, Any], str]]:
    """``(example, "file 'x', line n")`` for every non-blank line of a JSON-lines file."""
    path = Path(path)
    if not path.is_file():
        raise PreprocessError(f"input file {str(path)!r} does not exist")
    examples = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"file {str(path)!r}, line {number}"
            try:
                example = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PreprocessError(f"{where} is not valid JSON: {exc}") from exc
            if not isinstance(example, dict):
                raise PreprocessError(f"{where}: expected a JSON object, got {type(example).__name__}")
            examples.append((example, where))
    if not examples:
        raise PreprocessError(f"input file {str(path)!r} has no rows")
    return examples


def load_hub_splits() -> dict[str, list[tuple[dict[str, Any], str]]]:
    """The ``train`` and ``test`` splits of ``openai/gsm8k`` (config ``main``) from the hub."""
    try:
        import datasets
    except ImportError:
        raise PreprocessError(
            "reading GSM8K from the Hugging Face hub needs the `datasets` package (pip install datasets); "
            "or pass local files in GSM8K's format with --input-jsonl train=PATH --input-jsonl test=PATH"
        ) from None
    dataset = datasets.load_dataset(DATA_SOURCE, "main")
    return {
        split: [(dict(example), f"{DATA_SOURCE} {split} row {i}") for i, example in enumerate(dataset[split])]
        for split in ("train", "test")
    }


def convert(split: str, examples: Iterable[tuple[dict[str, Any], str]]) -> list[dict[str, Any]]:
    return [make_row(example, split, i, where) for i, (example, where) in enumerate(examples)]


def write_parquet(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(list(rows)), path)
    return path


def _split_and_path(spec: str) -> tuple[str, str]:
    """``train=raw/train.jsonl`` -> ``("train", "raw/train.jsonl")``; a bare path names its split by
    its file name (``raw/test.jsonl`` -> ``test``)."""
    split, sep, path = spec.partition("=")
    if not sep:
        return Path(spec).stem, spec
    if not split or not path:
        raise PreprocessError(
            f"--input-jsonl {spec!r} must look like SPLIT=PATH (e.g. train=raw/train.jsonl)"
        )
    return split, path


def main(argv: Sequence[str] | None = None) -> dict[str, Path]:
    parser = argparse.ArgumentParser(description="GSM8K -> verl-schema parquet files for rlcore (or verl).")
    parser.add_argument(
        "--local-dir", default="data/gsm8k", help="output folder for <split>.parquet (default: data/gsm8k)"
    )
    parser.add_argument(
        "--input-jsonl",
        action="append",
        default=[],
        metavar="SPLIT=PATH",
        help="read this split from a local JSON-lines file in GSM8K's raw format instead of the hub "
        "(repeat per split; a bare PATH names the split by its file name)",
    )
    args = parser.parse_args(argv)
    if args.input_jsonl:
        pairs = [_split_and_path(spec) for spec in args.input_jsonl]
        splits = {split: read_jsonl(path) for split, path in pairs}
    else:
        splits = load_hub_splits()
    written = {}
    for split, examples in splits.items():
        rows = convert(split, examples)
        written[split] = write_parquet(rows, Path(args.local_dir).expanduser() / f"{split}.parquet")
        print(f"{split}: {len(rows)} rows -> {written[split]}")
    return written


if __name__ == "__main__":
    try:
        main()
    except PreprocessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)

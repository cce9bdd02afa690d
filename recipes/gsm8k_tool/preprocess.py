"""GSM8K with a Python interpreter -> prompt files in verl's schema, for multi-turn tool use.

The rows are recipes/gsm8k/preprocess.py's (same splits, ``data_source``, ground truth, ``extra_info``) with
a system message that tells the model it may run Python and where to put its final answer, in place of
the single-turn instruction. The tool itself is described to the model by the chat template (rlcore
passes the tools' schemas as ``tools=`` when ``agent.enabled``).

    python recipes/gsm8k_tool/preprocess.py --local-dir data/gsm8k_tool
    python recipes/gsm8k_tool/preprocess.py --local-dir data/gsm8k_tool \\
        --input-jsonl train=raw/train.jsonl --input-jsonl test=raw/test.jsonl
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SYSTEM = (
    "You are a careful math assistant. You may call the python tool to run a Python program; it returns "
    "what the program prints. Use it for arithmetic. After your reasoning, write the final answer as "
    '"#### <number>".'
)


def _gsm8k() -> Any:
    """recipes/gsm8k/preprocess.py, loaded by path (recipes are folders of scripts, not a package)."""
    path = Path(__file__).resolve().parent.parent / "gsm8k" / "preprocess.py"
    spec = importlib.util.spec_from_file_location("gsm8k_preprocess", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


gsm8k = _gsm8k()
_single_turn_row = gsm8k.make_row


def make_row(example: dict[str, Any], split: str, index: int, where: str = "") -> dict[str, Any]:
    """The GSM8K row of ``example`` with the tool-use system message and the bare question."""
    row = _single_turn_row(example, split, index, where)
    row["prompt"] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": example["question"]},
    ]
    row["ability"] = "math_tool"
    return row


def main(argv: Sequence[str] | None = None) -> dict[str, Path]:
    """GSM8K's pipeline (hub or local files, checks, parquet) writing these rows."""
    gsm8k.make_row = make_row
    return gsm8k.main(argv)


if __name__ == "__main__":
    try:
        main()
    except gsm8k.PreprocessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)

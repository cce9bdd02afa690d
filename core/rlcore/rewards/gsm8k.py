"""GSM8K rule reward: the number after ``####`` against the reference answer (verl's semantics).

``strict`` mode needs the ``#### <number>`` format (so it also rewards the format); ``flexible`` takes the
last number anywhere in the response. Only the last 300 characters are searched: the final answer sits
at the end, and a regex over a very long response is slow.

>>> compute_score("openai/gsm8k", "3 + 4 = 7 so #### 7", "7")
1.0
>>> compute_score("openai/gsm8k", "the answer is 7", "7")
0.0
>>> compute_score("openai/gsm8k", "the answer is 7", "7", method="flexible")
1.0
"""

from __future__ import annotations

import re
from typing import Any

CLIP_CHARS = 300
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")


def extract_answer(solution_str: str, method: str = "strict") -> str | None:
    """The final answer in ``solution_str`` with thousands separators removed, or ``None``."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"gsm8k extraction method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-CLIP_CHARS:]
    if method == "strict":
        found = _STRICT.findall(tail)
        return found[-1].replace(",", "").replace("$", "") if found else None
    # The last match that is more than punctuation; verl keeps its commas here, and so do we.
    for candidate in reversed(_NUMBER.findall(tail)):
        if candidate not in ("", "."):
            return candidate
    return None


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """``score`` if the extracted answer equals ``ground_truth`` as a string, ``format_score`` if an answer
    was found but is wrong, 0 if none was found."""
    answer = extract_answer(solution_str, method)
    if answer is None:
        return 0.0
    return float(score) if answer == str(ground_truth) else float(format_score)

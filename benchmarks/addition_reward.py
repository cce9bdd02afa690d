"""The reward of ``benchmarks/vs_trl_cpu.py``: a user's file with verl's ``compute_score`` signature.

rlcore loads it through ``reward.custom_function_path``; the TRL run wraps the same function, so both
systems score completions identically. 1.0 when the last integer in the response is the sum, 0.1 for any
other integer (the format part, which a random tiny model learns first), 0 without one.
"""

from __future__ import annotations

import re

NUMBER = re.compile(r"-?\d+")


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    numbers = NUMBER.findall(solution_str)
    if not numbers:
        return 0.0
    return 1.0 if numbers[-1] == str(ground_truth).strip() else 0.1

"""The reward of ``benchmarks/vs_trl_cpu.py``: a user's file with verl's ``compute_score`` signature.

rlcore loads it through ``reward.custom_function_path``; the TRL run wraps the same function, so both
systems score completions identically. 1.0 when the last integer in the response is the sum; otherwise
up to 0.1 for the format, in proportion to the response's share of digits. The format part is dense on
purpose: the random-init tiny model samples nearly uniformly over its vocabulary, so an all-or-nothing
format score ("contains an integer") is the same for every sample of a group, the group advantages are
0 and nothing is learnt; a share of digits differs between samples and climbs, so the reward curves show
whether both systems learn alike.
"""

from __future__ import annotations

import re

NUMBER = re.compile(r"-?\d+")


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    numbers = NUMBER.findall(solution_str)
    if numbers and numbers[-1] == str(ground_truth).strip():
        return 1.0
    text = "".join(solution_str.split())
    return 0.1 * sum(c.isdigit() for c in text) / len(text) if text else 0.0

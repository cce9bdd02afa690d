"""The ``agent`` reward provider (``reward.provider=agent``): each episode's reward is the value its agent
program returned (:mod:`rlcore.endpoint.programs`), a number or a dict's ``score`` (or ``reward``).

An episode whose agent returned nothing (it timed out, failed, or returned ``None``) scores 0 and is
counted in ``reward/agent_no_value`` (the share of such rows): the run goes on, and the metric shows it.
A value of another kind is an error naming the row.
"""

from __future__ import annotations

from typing import Any

import torch

from rlcore.api.batch import Batch
from rlcore.api.reward import RewardProvider, place_sequence_scores


def agent_score(returned: Any, row: int) -> float | None:
    """The score in an agent's returned value; None when it gave none."""
    if returned is None:
        return None
    if isinstance(returned, dict):
        key = "score" if "score" in returned else "reward" if "reward" in returned else None
        if key is None:
            return None
        returned = returned[key]
    if isinstance(returned, bool) or not isinstance(returned, int | float):
        raise ValueError(
            f"reward.provider=agent: row {row}'s agent returned {returned!r}; return a number or a dict with "
            f"a numeric 'score'"
        )
    return float(returned)


class AgentReturnedReward(RewardProvider):
    """Reads ``agent_info[i]["returned"]`` (objects) and ``response_mask [B, R]``; returns
    ``token_level_scores [B, R]`` with each row's score on its last model token."""

    def __init__(self, config: Any = None):
        self.config = config

    def score(self, batch: Batch) -> Batch:
        infos = batch.objects.get("agent_info")
        if infos is None:
            raise ValueError(
                "reward.provider=agent scores what agent programs return, but this batch has no episodes; "
                "set agent.program or agent.command (or use reward.provider=rule)"
            )
        scores = [agent_score((info or {}).get("returned"), i) for i, info in enumerate(infos)]
        missing = sum(s is None for s in scores)
        values = torch.tensor([0.0 if s is None else s for s in scores], dtype=torch.float32)
        out = Batch({"token_level_scores": place_sequence_scores(values, batch["response_mask"])})
        out.meta["metrics"] = {"reward/agent_no_value": missing / max(len(scores), 1)}
        return out

"""The reward contract."""

from __future__ import annotations

import abc
from typing import Any, ClassVar

from rlcore.api.batch import Batch


class RewardProvider(abc.ABC):
    """Scores a batch of responses.

    Input: a batch with ``responses [B, R]``, ``response_mask [B, R]``, and per-sample ``response_text``,
    ``data_source``, ``ground_truth``, ``extra_info``. Output: a batch with ``token_level_scores [B, R]``
    (a sequence-level score sits on the last response token) and optional per-sample
    ``reward_extra_info`` dicts.
    """

    config_class: ClassVar[type | None] = None

    @abc.abstractmethod
    def score(self, batch: Batch) -> Batch:
        """Return ``token_level_scores [B, R]`` (float32) for ``batch``."""

    def close(self) -> None:
        """Release worker processes or models. Default: nothing."""


def place_sequence_scores(scores: Any, response_mask: Any) -> Any:
    """Put one score per sequence ``[B]`` on the last valid token of ``response_mask [B, R]``: the last
    index where the mask is 1, which in a multi-turn response (``1 1 0 0 1 1 0 0``: tool observations
    masked) is the last model token, not ``mask.sum() - 1``.

    Rows with no valid token get nothing (their score is dropped: they cannot carry a gradient).
    """
    import torch

    scores = torch.as_tensor(scores, dtype=torch.float32)
    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    valid = response_mask.bool()
    if valid.shape[-1] == 0:
        return out
    positions = torch.arange(valid.shape[-1], device=valid.device).expand_as(valid)
    last = torch.where(valid, positions, -1).amax(dim=-1).cpu()
    rows = (last >= 0).nonzero().flatten()
    out[rows, last[rows]] = scores[rows]
    return out

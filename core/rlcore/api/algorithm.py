"""The algorithm contract: the control flow of one RL algorithm, run by the single controller."""

from __future__ import annotations

import abc
from typing import Any, ClassVar

from rlcore.api.batch import Batch


class Algorithm(abc.ABC):
    """One RL algorithm's step, written top to bottom over role handles.

    ``roles`` lists the worker roles it needs beyond ``actor`` and ``rollout`` (``"critic"``,
    ``"reference"``, ``"reward_model"``). ``defaults`` are the ``algorithm:`` config values this preset
    sets (estimator, loss, KL), which the user's config may override.

    :meth:`step` receives ``ctx``, the controller's view of the run: role handles
    (``ctx.actor``, ``ctx.rollout``, ``ctx.critic``, ``ctx.reference``), the reward scorer, the
    config, and the helpers every algorithm shares (generation, weight sync, metrics).
    """

    roles: ClassVar[tuple[str, ...]] = ()
    defaults: ClassVar[dict[str, Any]] = {}

    @abc.abstractmethod
    def step(self, ctx: Any, prompts: Batch) -> dict[str, float]:
        """Run one training step on ``prompts`` (a batch of ``B`` prompts) and return its metrics."""

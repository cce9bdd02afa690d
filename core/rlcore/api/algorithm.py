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

    The overlapping training modes (``trainer.mode: one_step_off | async``) need the step in two halves:
    ``collect(ctx, prompts) -> Batch`` (generation and scoring: the rollout and the reward only) and
    ``learn(ctx, batch) -> metrics`` (the rest but the weight sync, which the trainer then runs). An
    algorithm that defines both runs in every mode (the built-in flows, :class:`rlcore.flows.base.Flow`,
    do); one with only :meth:`step` runs synchronously.
    """

    roles: ClassVar[tuple[str, ...]] = ()
    defaults: ClassVar[dict[str, Any]] = {}

    @abc.abstractmethod
    def step(self, ctx: Any, prompts: Batch) -> dict[str, float]:
        """Run one training step on ``prompts`` (a batch of ``B`` prompts) and return its metrics."""

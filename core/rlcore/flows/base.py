"""What every built-in flow builds before its first step: the run's preset and the actor's loss."""

from __future__ import annotations

from typing import Any

from rlcore.algorithms.losses import ActorLoss
from rlcore.api import Algorithm, Batch


class Flow(Algorithm):
    """An :class:`~rlcore.api.Algorithm` that keeps the run's ``preset`` and trains the actor with
    ``actor_loss``, the preset's policy loss.

    A subclass writes its step in two halves, :meth:`collect` (what needs the rollout and the reward:
    generate, score) and :meth:`learn` (what needs the train roles), and extends ``__init__`` for anything
    else it builds, calling this one first. :meth:`step` runs them in turn and syncs the weights; the
    overlapping training modes run ``collect`` ahead, on another thread (:mod:`rlcore.trainer.overlap`).
    """

    def __init__(self, preset: Any, config: Any):
        self.preset = preset
        # seq-mean-token-sum-norm divides by a constant: the longest response, so that micro-batches
        # padded to different widths share one scale.
        self.actor_loss = ActorLoss.from_preset(preset, loss_scale_factor=config.rollout.max_response_length)

    def score_generated(self, ctx: Any, batch: Batch) -> Batch:
        """Score generated rows (``trainer.mode: stream`` calls it on each round's finished groups; the
        algorithm's collect does the same after generate). Default: the reward provider's score."""
        from rlcore.flows.phases import score

        return score(ctx, batch)

    def keep_group(self, ctx: Any, group: Batch) -> bool:
        """Whether a scored group (its ``rollout.n`` rows) may be trained; ``False`` drops it and the stream
        generates another in its place (dynamic sampling). Default: every group."""
        return True

    def step(self, ctx: Any, prompts: Batch) -> dict[str, float]:
        from rlcore.flows.phases import sync_weights

        batch = self.collect(ctx, prompts)
        metrics = self.learn(ctx, batch)
        sync_weights(ctx)
        return metrics

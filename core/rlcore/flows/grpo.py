"""Critic-free, outcome-reward algorithms: GRPO, RLOO, REINFORCE++ and GSPO.

They share one control flow and differ only in their preset: the advantage estimator (group-normalised,
leave-one-out, whitened returns), the policy loss (token-level PPO clip, GSPO's sequence-level ratio)
and where KL enters (a loss term for GRPO, a reward penalty for RLOO and REINFORCE++, none for GSPO).
"""

from __future__ import annotations

from typing import ClassVar

from rlcore.api import Batch
from rlcore.flows.base import Flow
from rlcore.flows.context import StepContext
from rlcore.flows.phases import (
    compute_advantages,
    compute_old_log_probs,
    compute_ref_log_probs,
    correct_off_policy,
    generate,
    needs_old_log_probs,
    score,
    update_actor,
)
from rlcore.telemetry.metrics import batch_metrics


class GRPO(Flow):
    """Group Relative Policy Optimization (Shao et al. 2024): ``rollout.n`` responses per prompt, the
    group's reward statistics as the baseline, no value model."""

    preset_name: ClassVar[str] = "grpo"

    def collect(self, ctx: StepContext, prompts: Batch) -> Batch:
        batch = generate(ctx, prompts)
        return score(ctx, batch)

    def learn(self, ctx: StepContext, batch: Batch) -> dict[str, float]:
        if needs_old_log_probs(ctx, batch):
            batch = compute_old_log_probs(ctx, batch)
        batch = correct_off_policy(ctx, batch)
        if ctx.reference is not None:
            batch = compute_ref_log_probs(ctx, batch)
        batch = compute_advantages(ctx, batch)
        update_actor(ctx, batch, self.actor_loss)
        return batch_metrics(batch, ctx.config.rollout.max_response_length)


class RLOO(GRPO):
    """REINFORCE leave-one-out (Ahmadian et al. 2024): each response's baseline is the mean reward of
    the other responses to its prompt; KL as a reward penalty."""

    preset_name = "rloo"


class ReinforcePlusPlus(GRPO):
    """REINFORCE++ (Hu 2025): KL-shaped token returns, whitened over the batch; no group baseline."""

    preset_name = "reinforce_plus_plus"


class GSPO(GRPO):
    """Group Sequence Policy Optimization (Zheng et al. 2025): GRPO's advantages with a sequence-level
    importance ratio and clipping."""

    preset_name = "gspo"

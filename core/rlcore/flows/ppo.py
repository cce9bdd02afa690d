"""PPO with a learned value function (Schulman et al. 2017; the RLHF recipe of Ouyang et al. 2022).

The critic estimates a value per response token; GAE turns rewards and values into advantages; the
critic is then fitted to the returns and the actor takes clipped policy-gradient steps.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rlcore.algorithms.losses import CriticLoss
from rlcore.api import Batch
from rlcore.flows.base import Flow
from rlcore.flows.context import StepContext
from rlcore.flows.phases import (
    compute_advantages,
    compute_old_log_probs,
    compute_ref_log_probs,
    compute_values,
    correct_off_policy,
    generate,
    needs_old_log_probs,
    score,
    update_actor,
    update_critic,
)
from rlcore.telemetry.metrics import batch_metrics


class PPO(Flow):
    """Actor-critic PPO with GAE advantages."""

    preset_name: ClassVar[str] = "ppo"
    roles: ClassVar[tuple[str, ...]] = ("critic",)

    def __init__(self, preset: Any, config: Any):
        super().__init__(preset, config)
        self.critic_loss = CriticLoss.from_preset(preset, cliprange_value=config.critic.cliprange_value)

    def collect(self, ctx: StepContext, prompts: Batch) -> Batch:
        batch = generate(ctx, prompts)
        return score(ctx, batch)

    def learn(self, ctx: StepContext, batch: Batch) -> dict[str, float]:
        if needs_old_log_probs(ctx, batch):
            batch = compute_old_log_probs(ctx, batch)
        batch = correct_off_policy(ctx, batch)
        if ctx.reference is not None:
            batch = compute_ref_log_probs(ctx, batch)
        batch = compute_values(ctx, batch)
        batch = compute_advantages(ctx, batch)
        # The critic learns from this batch's returns first; the actor's update does not read values.
        update_critic(ctx, batch, self.critic_loss)
        update_actor(ctx, batch, self.actor_loss)
        return batch_metrics(batch, ctx.config.rollout.max_response_length)

"""ReMax (Li et al. 2023): REINFORCE with the reward of the greedy response as each prompt's baseline.

Each step generates twice: sampled responses to learn from, and one greedy response per prompt whose
score is subtracted from the sampled responses' returns.
"""

from __future__ import annotations

from typing import ClassVar

import torch

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


def greedy_baselines(ctx: StepContext, prompts: Batch) -> list[float]:
    """Score of one greedy (temperature 0) response per prompt: ReMax's baseline ``b``, one per prompt."""
    greedy = generate(ctx, prompts, n=1, temperature=0.0, phase="generate_baseline")
    greedy = score(ctx, greedy, phase="score_baseline")
    return greedy["token_level_scores"].double().sum(-1).tolist()


class ReMax(Flow):
    """ReMax: sampled responses minus the greedy response's reward; KL as a reward penalty."""

    preset_name: ClassVar[str] = "remax"

    def collect(self, ctx: StepContext, prompts: Batch) -> Batch:
        baselines = greedy_baselines(ctx, prompts)
        batch = generate(ctx, prompts)
        batch = score(ctx, batch)
        n = len(batch) // len(prompts)
        batch.tensors["reward_baselines"] = torch.tensor([b for b in baselines for _ in range(n)])
        return batch

    def learn(self, ctx: StepContext, batch: Batch) -> dict[str, float]:
        if needs_old_log_probs(ctx, batch):
            batch = compute_old_log_probs(ctx, batch)
        batch = correct_off_policy(ctx, batch)
        if ctx.reference is not None:
            batch = compute_ref_log_probs(ctx, batch)
        batch = compute_advantages(ctx, batch)
        update_actor(ctx, batch, self.actor_loss)
        metrics = batch_metrics(batch, ctx.config.rollout.max_response_length)
        metrics["reward/greedy_baseline_mean"] = float(batch["reward_baselines"].double().mean())
        return metrics

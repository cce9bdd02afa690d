"""DAPO (Yu et al. 2025): GRPO with clip-higher, token-level loss, overlong reward shaping and dynamic
sampling.

Dynamic sampling: a group whose responses all got the same reward has zero advantage and teaches
nothing, so it is dropped, and more prompts are generated until the training batch holds
``data.train_batch_size`` groups with varied rewards, from at most ``filter_groups.max_num_gen_batches``
generation batches (``dynamic_sampling/num_gen_batches`` counts them). Every round samples from the same
weights, so the merged batch is as on-policy as one round's: the old-log-prob pass is skipped under the
same conditions as GRPO's.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from rlcore.algorithms.dapo import DynamicSampler, apply_overlong_penalty, filter_groups, group_metric
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

logger = logging.getLogger(__name__)

#: The DAPO recipe's overlong buffer is 4096 of 20480 response tokens: a fifth of the budget.
_BUFFER_FRACTION = 0.2


def overlong_buffer_len(preset: Any, max_response_length: int) -> int:
    """The preset's overlong buffer, scaled down to a fifth of ``max_response_length`` when it does not
    fit (the recipe's 4096 tokens assume 20480-token responses)."""
    buffer = preset.overlong_buffer.len
    if buffer <= max_response_length:
        return buffer
    scaled = max(1, int(max_response_length * _BUFFER_FRACTION))
    logger.info(
        "DAPO overlong buffer of %d tokens exceeds rollout.max_response_length=%d; using %d tokens "
        "(the recipe's ratio)",
        buffer,
        max_response_length,
        scaled,
    )
    return scaled


def shape_overlong(ctx: StepContext, batch: Batch, buffer_len: int) -> Batch:
    """Soft overlong punishment on ``token_level_scores`` (the last ``buffer_len`` tokens before the
    length limit cost up to ``penalty_factor``)."""
    shaping = ctx.preset.overlong_buffer
    # The whole response span (tool tokens of a multi-turn episode included), as the budget counts it.
    span = batch["attention_mask"][:, -batch["responses"].shape[1] :].sum(-1)
    scores, penalty = apply_overlong_penalty(
        batch["token_level_scores"],
        batch["response_mask"],
        ctx.config.rollout.max_response_length,
        buffer_len,
        shaping.penalty_factor,
        response_length=span,
    )
    batch.tensors["token_level_scores"] = scores
    ctx.record({"reward/overlong_penalty_mean": float(penalty.mean())})
    return batch


def filter_metric(batch: Batch, metric: str) -> list[float]:
    """Per-sample values of ``filter_groups.metric``; ``acc`` falls back to the sequence reward when
    the scorer reports no ``acc`` (a rule returning a plain number)."""
    try:
        return group_metric(batch, metric)
    except KeyError:
        if metric != "acc":
            raise
        return group_metric(batch, "seq_reward")


class DAPO(Flow):
    """Decoupled clip and dynamic sampling policy optimization."""

    preset_name: ClassVar[str] = "dapo"

    def __init__(self, preset: Any, config: Any):
        super().__init__(preset, config)
        self.buffer_len = overlong_buffer_len(preset, config.rollout.max_response_length)

    def generate_and_score(self, ctx: StepContext, prompts: Batch) -> Batch:
        return self.score_generated(ctx, generate(ctx, prompts))

    def score_generated(self, ctx: StepContext, batch: Batch) -> Batch:
        batch = score(ctx, batch)
        if self.preset.overlong_buffer.enable:
            batch = shape_overlong(ctx, batch, self.buffer_len)
        return batch

    def keep_group(self, ctx: StepContext, group: Batch) -> bool:
        """With dynamic sampling, only groups whose ``filter_groups.metric`` varies (the stream's refill)."""
        if not self.preset.filter_groups.enable:
            return True
        values = filter_metric(group, self.preset.filter_groups.metric)
        return bool(filter_groups(group.objects["uid"], values).all())

    def dynamic_sample(self, ctx: StepContext, prompts: Batch) -> Batch:
        """Generation batches until ``len(prompts)`` groups with varied rewards are kept (the refills
        draw the next prompts of the training data)."""
        filtering = self.preset.filter_groups
        sampler = DynamicSampler(len(prompts), filtering.max_num_gen_batches)
        while True:
            batch = self.generate_and_score(ctx, prompts)
            if sampler.add(batch, filter_metric(batch, filtering.metric)):
                break
            prompts = ctx.next_prompts()
        ctx.record(sampler.metrics())
        ctx.record({"dynamic_sampling/refills": sampler.num_gen_batches - 1})
        return sampler.take()

    def collect(self, ctx: StepContext, prompts: Batch) -> Batch:
        if self.preset.filter_groups.enable:
            return self.dynamic_sample(ctx, prompts)
        return self.generate_and_score(ctx, prompts)

    def learn(self, ctx: StepContext, batch: Batch) -> dict[str, float]:
        if needs_old_log_probs(ctx, batch):
            batch = compute_old_log_probs(ctx, batch)
        batch = correct_off_policy(ctx, batch)
        if ctx.reference is not None:
            batch = compute_ref_log_probs(ctx, batch)
        batch = compute_advantages(ctx, batch)
        update_actor(ctx, batch, self.actor_loss)
        return batch_metrics(batch, ctx.config.rollout.max_response_length)

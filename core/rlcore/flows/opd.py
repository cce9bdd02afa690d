"""On-policy distillation (OPD): the student samples, the teacher scores every sampled token, and the
per-token reverse KL ``log pi_student - log pi_teacher`` is the student's (negative) advantage.

The step is GRPO's with one more role and another advantage: the teacher (``teacher:``, its own engine
and world size, forward-only) computes log-probs of the student's response tokens, the actor's
old-log-prob pass gives the student's (always run: the advantage reads them before the update), and
:func:`rlcore.algorithms.distill.opd_advantages` turns the pair, plus ``opd_reward_weight`` times the task
reward's advantage, into per-token advantages that the preset's policy loss (PPO's clip) trains on.

=============================  ==========================================  ============
phase                          adds                                        role
=============================  ==========================================  ============
``teacher_log_probs``          ``teacher_log_prob [B, R]``                 teacher
``advantages``                 ``token_level_rewards, advantages,          (driver)
                               returns [B, R]``, ``distill/*`` metrics
=============================  ==========================================  ============
"""

from __future__ import annotations

from typing import ClassVar

from rlcore.algorithms.distill import distill_metrics, opd_advantages
from rlcore.api import Batch
from rlcore.config.specs import off_policy_correction
from rlcore.flows.base import Flow
from rlcore.flows.context import StepContext
from rlcore.flows.phases import (
    compute_advantages,
    compute_old_log_probs,
    compute_ref_log_probs,
    correct_off_policy,
    generate,
    score,
    update_actor,
)
from rlcore.telemetry.metrics import batch_metrics


def compute_teacher_log_probs(ctx: StepContext, batch: Batch) -> Batch:
    """``teacher_log_prob [B, R]``: the teacher's log-probs of the student's sampled tokens (the student's
    prompt and response ids as they are: the tokenizers were checked to be one)."""
    with ctx.phase("teacher_log_probs"):
        ctx.memory.use("train")
        out = ctx.teacher.infer(batch, ("log_probs",))
    batch.tensors["teacher_log_prob"] = out["log_probs"]
    return batch


def compute_distill_advantages(ctx: StepContext, batch: Batch) -> Batch:
    """``advantages``/``returns`` of OPD: ``opd_kl_coef (teacher - student)`` per token, plus
    ``opd_reward_weight`` times the task reward's advantage (the preset's estimator over
    ``token_level_rewards``, computed only when the weight is not 0). The student's log-probs are
    ``old_log_probs``: the actor's before this update (the rollout's own under ``off_policy: behaviour``).
    Records the ``distill/*`` metrics and ``distill/advantage_abs_mean``."""
    preset = ctx.preset
    task = None
    if preset.opd_reward_weight != 0:
        batch = compute_advantages(ctx, batch)  # the task reward's advantage (KL in the reward included)
        task = batch["advantages"]
    else:
        batch.tensors["token_level_rewards"] = batch["token_level_scores"]
    student, teacher, mask = batch["old_log_probs"], batch["teacher_log_prob"], batch["response_mask"]
    with ctx.phase("advantages"):
        advantages, returns = opd_advantages(
            student,
            teacher,
            mask,
            kl_coef=preset.opd_kl_coef,
            task_advantages=task,
            task_weight=preset.opd_reward_weight,
        )
    batch.tensors["advantages"], batch.tensors["returns"] = advantages, returns
    metrics = distill_metrics(student, teacher, mask)
    if metrics:
        metrics["distill/advantage_abs_mean"] = float(advantages[mask.bool()].abs().double().mean())
    ctx.record(metrics)
    return batch


class OPD(Flow):
    """On-policy distillation from the ``teacher:`` model, optionally mixed with the task reward."""

    preset_name: ClassVar[str] = "opd"
    roles: ClassVar[tuple[str, ...]] = ("teacher",)

    def collect(self, ctx: StepContext, prompts: Batch) -> Batch:
        batch = generate(ctx, prompts)
        return score(ctx, batch)  # the task reward: reported, and mixed in when opd_reward_weight > 0

    def learn(self, ctx: StepContext, batch: Batch) -> dict[str, float]:
        if off_policy_correction(ctx.config) != "behaviour":  # behaviour: the rollout's own log-probs
            batch = compute_old_log_probs(ctx, batch)
        batch = correct_off_policy(ctx, batch)
        if ctx.reference is not None:
            batch = compute_ref_log_probs(ctx, batch)
        batch = compute_teacher_log_probs(ctx, batch)
        batch = compute_distill_advantages(ctx, batch)
        update_actor(ctx, batch, self.actor_loss)
        return batch_metrics(batch, ctx.config.rollout.max_response_length)

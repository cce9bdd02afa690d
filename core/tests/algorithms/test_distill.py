"""On-policy distillation's tensor functions and loss, against float64 loops written from the formulas
(docs/algorithms.md, "On-policy distillation"): the advantage ``kl_coef (log pi_T - log pi_S) + w A_task``
per valid token, its metrics, and the PPO loss the ``opd`` preset trains it with, value and gradient."""

import math

import attrs
import pytest
import torch
from rlcore.algorithms import ActorLoss, distill_metrics, get_preset, opd_advantages
from rlcore.api import Batch
from rlcore.config import ConfigError, load_config
from rlcore.flows import resolve_preset


def make(seed=0, rows=7, length=5):
    """Student and teacher log-probs, a ragged mask with an empty row, NaN and -inf on masked tokens."""
    g = torch.Generator().manual_seed(seed)
    student = -torch.rand(rows, length, generator=g, dtype=torch.float64) * 3
    teacher = -torch.rand(rows, length, generator=g, dtype=torch.float64) * 3
    lengths = torch.randint(1, length + 1, (rows,), generator=g)
    lengths[2] = 0
    mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).long()
    student[~mask.bool()] = float("nan")
    teacher[~mask.bool()] = -float("inf")
    task = torch.randn(rows, length, generator=g, dtype=torch.float64)
    return student, teacher, mask, task


def test_the_advantage_is_the_teacher_student_gap_per_token_plus_the_weighted_task_advantage():
    student, teacher, mask, task = make()
    adv, returns = opd_advantages(student, teacher, mask, kl_coef=0.7, task_advantages=task, task_weight=0.25)
    for i in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if mask[i, t]:
                want = 0.7 * (float(teacher[i, t]) - float(student[i, t])) + 0.25 * float(task[i, t])
            else:
                want = 0.0
            assert float(adv[i, t]) == pytest.approx(want, abs=1e-12)
    assert adv.dtype == torch.float64 and torch.equal(adv, returns) and not adv.requires_grad
    # Alone (no task reward): the gap itself; float32 inputs give float32.
    alone, _ = opd_advantages(student.float(), teacher.float(), mask)
    want = torch.where(mask.bool(), teacher - student, torch.zeros_like(student)).float()
    assert alone.dtype == torch.float32
    torch.testing.assert_close(alone, want, rtol=0, atol=1e-6)


def test_a_student_that_is_its_teacher_gets_exactly_zero_advantage_and_gradient():
    student, _, mask, _ = make(1)
    adv, _ = opd_advantages(student, student.clone(), mask)
    assert torch.count_nonzero(adv) == 0
    log_prob = torch.nan_to_num(student, nan=-1.0).clone().requires_grad_()
    batch = Batch({"advantages": adv, "response_mask": mask, "old_log_probs": log_prob.detach().clone()})
    loss, metrics = ActorLoss.from_preset(get_preset("opd"))({"log_probs": log_prob}, batch)
    loss.backward()
    assert float(loss.detach()) == 0.0 and torch.count_nonzero(log_prob.grad) == 0
    assert distill_metrics(student, student, mask)["distill/reverse_kl_k3"] == 0.0


def test_a_task_weight_without_task_advantages_or_mismatched_shapes_is_refused():
    student, teacher, mask, _ = make()
    with pytest.raises(ValueError, match="task_weight=0.5 needs task_advantages"):
        opd_advantages(student, teacher, mask, task_weight=0.5)
    with pytest.raises(ValueError, match=r"must be one \[B, T\] shape"):
        opd_advantages(student, teacher[:, :3], mask)


def test_the_metrics_are_the_reverse_kl_estimates_over_valid_tokens():
    student, teacher, mask, _ = make(2)
    d, k3, seq, lp_t, lp_s = [], [], [], [], []
    for i in range(mask.shape[0]):
        row = [t for t in range(mask.shape[1]) if mask[i, t]]
        if row:
            seq.append(sum(float(student[i, t]) - float(teacher[i, t]) for t in row))
        for t in row:
            x = float(student[i, t]) - float(teacher[i, t])
            d.append(x)
            k3.append(math.exp(-x) - 1 + x)
            lp_t.append(float(teacher[i, t]))
            lp_s.append(float(student[i, t]))
    got = distill_metrics(student, teacher, mask)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert got["distill/reverse_kl"] == pytest.approx(mean(d), abs=1e-12)
    assert got["distill/reverse_kl_k3"] == pytest.approx(mean(k3), abs=1e-12)
    assert got["distill/reverse_kl_seq"] == pytest.approx(mean(seq), abs=1e-12)  # the empty row is left out
    assert got["distill/teacher_log_prob"] == pytest.approx(mean(lp_t), abs=1e-12)
    assert got["distill/student_log_prob"] == pytest.approx(mean(lp_s), abs=1e-12)
    assert distill_metrics(student, teacher, torch.zeros_like(mask)) == {}


def test_the_opd_loss_and_its_gradient_match_ppo_on_the_distillation_advantage():
    """The ``opd`` preset's loss (PPO clip 0.2, dual clip 3, token-mean) on the OPD advantage, with a
    training forward ``log_prob`` that moved away from the student's ``old`` (ratios in and out of the
    clip range): value and gradient against a loop over the formula, the gradient worked out by hand
    (``-A r / N`` where the unclipped term is the active one, else 0)."""
    student, teacher, mask, _ = make(3)
    g = torch.Generator().manual_seed(4)
    old = torch.nan_to_num(student, nan=-1.0)
    log_prob = (old + torch.randn(old.shape, generator=g, dtype=torch.float64) * 0.3).requires_grad_()
    adv, _ = opd_advantages(student, teacher, mask)
    batch = Batch({"advantages": adv, "response_mask": mask, "old_log_probs": old})
    loss, metrics = ActorLoss.from_preset(get_preset("opd"))({"log_probs": log_prob}, batch)
    loss.backward()

    valid = [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t]]
    n = len(valid)
    want_loss, want_grad, clipped = 0.0, torch.zeros_like(old), 0
    for i, t in valid:
        a = float(teacher[i, t]) - float(student[i, t])
        r = math.exp(float(log_prob.detach()[i, t]) - float(old[i, t]))
        unclipped, clip = -a * r, -a * min(max(r, 0.8), 1.2)
        term, active = (unclipped, True) if unclipped >= clip else (clip, False)
        if a < 0 and -a * 3.0 < term:
            term, active = -a * 3.0, False
        clipped += clip > unclipped
        want_loss += term / n
        want_grad[i, t] = -a * r / n if active else 0.0
    assert clipped > 0  # the case exercises the clip
    assert float(loss.detach()) == pytest.approx(want_loss, abs=1e-12)
    torch.testing.assert_close(log_prob.grad, want_grad, rtol=0, atol=1e-12)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(clipped / n, abs=1e-6)  # a float32 metric


def test_the_opd_preset_and_its_config_keys():
    preset = get_preset("opd")
    assert (preset.opd_kl_coef, preset.opd_reward_weight, preset.adv_estimator) == (1.0, 0.0, "grpo")
    assert preset.roles == () and not preset.needs_reference  # the teacher is the flow's role
    from rlcore.plugins import registry

    flow = registry("algorithms").get("opd")
    assert flow.roles == ("teacher",)
    config = load_config(
        overrides=["algorithm.name=opd", "algorithm.opd_reward_weight=0.5", "algorithm.opd_kl_coef=2"]
    )
    resolved = resolve_preset(config.algorithm, flow)
    assert attrs.evolve(preset, opd_kl_coef=2.0, opd_reward_weight=0.5) == resolved
    with pytest.raises(ConfigError, match=r"algorithm\.opd_reward_weight.*must be >= 0"):
        load_config(overrides=["algorithm.name=opd", "algorithm.opd_reward_weight=-1"])

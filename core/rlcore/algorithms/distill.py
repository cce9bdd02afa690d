"""On-policy distillation (OPD): the student samples, a teacher scores the student's own tokens, and the
per-token reverse KL is the student's advantage.

With ``d_it = log pi_S(y_it) - log pi_T(y_it)`` for response token ``t`` of row ``i`` (the token the
student sampled, the prefix the student wrote), ``d_it`` is a one-sample estimate of the per-token
reverse KL ``KL(pi_S || pi_T)`` at that prefix. Minimising it with a policy gradient means rewarding
each token by ``-d_it`` (Agarwal et al. 2024, GKD, arXiv:2306.13649; Gu et al. 2024, MiniLLM,
arXiv:2306.08543; Thinking Machines, "On-policy distillation", 2025): a token the teacher finds more
likely than the student does is reinforced, one it finds less likely is pushed down. There is no value
model and no group: every token has its own signal, the same for a group of one.

:func:`opd_advantages` optionally adds the task reward's advantage (any estimator's, e.g. GRPO's group
baseline) with a weight, the "mixed" form of verl's and slime's OPD. :func:`distill_metrics` reports how
far the student is from the teacher on its own samples.

Shapes: ``[B, T]`` for log-probs, masks and advantages; masked tokens get exactly 0 whatever the
log-probs hold there (NaN and infinities included).

>>> import torch
>>> s, t = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-0.5, -3.0]])
>>> adv, _ = opd_advantages(s, t, torch.tensor([[1, 0]]))
>>> adv.tolist()
[[0.5, 0.0]]
"""

from __future__ import annotations

import torch


def _masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` where ``mask`` is set, exactly 0 elsewhere (also where ``values`` is not finite)."""
    return torch.where(mask.bool(), values, torch.zeros_like(values))


def opd_advantages(
    student_log_prob: torch.Tensor,
    teacher_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    kl_coef: float = 1.0,
    task_advantages: torch.Tensor | None = None,
    task_weight: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The OPD advantage ``A_it = m_it (kl_coef (log pi_T - log pi_S)_it + task_weight * task_it)``.

    ``student_log_prob``, ``teacher_log_prob``: ``[B, T]`` log-probs of the sampled tokens under the
    student (the policy before this update) and the teacher, at the same temperature; ``response_mask``
    ``[B, T]``; ``task_advantages`` ``[B, T]``: the task reward's advantage from any estimator (needed
    when ``task_weight`` is not 0). Returns ``(advantages, returns)``, both ``[B, T]``, equal (as the
    outcome estimators return them), float32 (float64 for float64 inputs), no gradient.
    """
    if student_log_prob.shape != teacher_log_prob.shape or student_log_prob.shape != response_mask.shape:
        raise ValueError(
            f"student log-probs {tuple(student_log_prob.shape)}, teacher log-probs "
            f"{tuple(teacher_log_prob.shape)} and response_mask {tuple(response_mask.shape)} must be one [B, T] shape"
        )
    dtype = torch.float64 if student_log_prob.dtype == torch.float64 else torch.float32
    mask = response_mask.bool()
    with torch.no_grad():
        gap = _masked(teacher_log_prob.to(torch.float64) - student_log_prob.to(torch.float64), mask)
        advantages = kl_coef * gap
        if task_weight != 0:
            if task_advantages is None:
                raise ValueError(f"task_weight={task_weight} needs task_advantages [B, T]")
            advantages = advantages + task_weight * _masked(task_advantages.to(torch.float64), mask)
        advantages = advantages.to(dtype)
    return advantages, advantages.clone()


def distill_metrics(
    student_log_prob: torch.Tensor, teacher_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """How far the student is from the teacher on the student's own samples, in float64 (``{}`` when no
    token is valid). With ``d = log pi_S - log pi_T`` over the valid tokens:

    - ``distill/reverse_kl``: mean ``d``, the k1 estimate of the per-token ``KL(pi_S || pi_T)``
      (unbiased; a single batch's value may be negative);
    - ``distill/reverse_kl_k3``: mean ``exp(-d) - 1 + d``, Schulman's k3 estimate (never negative,
      0 only when the two agree on every sampled token);
    - ``distill/reverse_kl_seq``: mean over responses of the sum of ``d`` (the sequence-level KL);
    - ``distill/teacher_log_prob``, ``distill/student_log_prob``: mean log-prob of the sampled tokens
      under each (``-teacher_log_prob`` is the teacher's per-token cross-entropy on the student's text).
    """
    mask = response_mask.bool()
    if not bool(mask.any()):
        return {}
    s, t = student_log_prob.to(torch.float64)[mask], teacher_log_prob.to(torch.float64)[mask]
    d = s - t
    rows = mask.any(-1)
    per_row = _masked(student_log_prob.to(torch.float64) - teacher_log_prob.to(torch.float64), mask).sum(-1)
    return {
        "distill/reverse_kl": float(d.mean()),
        "distill/reverse_kl_k3": float((torch.expm1(-d) + d).mean()),
        "distill/reverse_kl_seq": float(per_row[rows].mean()),
        "distill/teacher_log_prob": float(t.mean()),
        "distill/student_log_prob": float(s.mean()),
    }

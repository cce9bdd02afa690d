"""KL penalties between the policy and the reference policy, and the controllers of their coefficient.

Per-token estimators of ``KL(pi || pi_ref)`` from the log-probs of the sampled token (J. Schulman,
"Approximating KL divergence", 2020, http://joschu.net/blog/kl-approx.html), with ``d = log_prob -
ref_log_prob``:

==================  ==================================  =========================================
kind                value                               note
==================  ==================================  =========================================
``kl``, ``k1``      ``d``                               unbiased, high variance, can be negative
``abs``             ``|d|``
``mse``, ``k2``     ``d^2 / 2``                         biased, low variance; gradient is unbiased
``low_var_kl``,     ``exp(-d) + d - 1``                 unbiased, non-negative; clamped to
``k3``                                                  ``[-10, 10]`` (``d`` to ``[-20, 20]``)
==================  ==================================  =========================================

A ``+`` suffix (``k3+``, ``low_var_kl+``, ``kl+``, ``abs+``) keeps the value of the estimator but takes the
gradient of ``k2`` (a straight-through estimator): k1 and k3 have the right expectation but not the right
expected gradient as a loss, k2 has the right gradient. ``mse+`` / ``k2+`` equal ``mse``.

Controllers (Ziegler et al. 2019, https://arxiv.org/abs/1909.08593) hold the coefficient ``beta`` of a KL
penalty in the reward: fixed, or adapted towards a target KL.
"""

from __future__ import annotations

import attrs
import torch

from rlcore.algorithms.aggregation import masked_mean

_BASE_KINDS = {"kl": "k1", "k1": "k1", "abs": "abs", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}
#: Every accepted ``kind`` of :func:`kl_penalty`.
KL_PENALTY_KINDS = tuple(_BASE_KINDS) + tuple(k + "+" for k in _BASE_KINDS)


def check_kl_kind(kind: str) -> None:
    """Raise a ``ValueError`` listing the kinds if ``kind`` is not a known KL estimator."""
    if kind not in KL_PENALTY_KINDS:
        extra = " (the full-vocabulary KL needs logits, not log-probs of one token)" if kind == "full" else ""
        raise ValueError(f"unknown KL penalty {kind!r}{extra}; use one of {', '.join(KL_PENALTY_KINDS)}")


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL estimate ``[B, T]`` of ``log_prob [B, T]`` against ``ref_log_prob [B, T]``.

    Computed in at least float32 (bf16 inputs give a float32 result). ``kind``: see the module docstring.

    >>> import torch
    >>> kl_penalty(torch.tensor([[0.0]]), torch.tensor([[-1.0]]), "kl")
    tensor([[1.]])
    """
    check_kl_kind(kind)
    if log_prob.shape != ref_log_prob.shape:
        raise ValueError(
            f"log_prob {tuple(log_prob.shape)} and ref_log_prob {tuple(ref_log_prob.shape)} differ in shape"
        )
    dtype = torch.promote_types(torch.promote_types(log_prob.dtype, ref_log_prob.dtype), torch.float32)
    diff = log_prob.to(dtype) - ref_log_prob.to(dtype)
    straight_through = kind.endswith("+")
    base = _BASE_KINDS[kind.rstrip("+")]
    value = _estimate(diff, base)
    if not straight_through or base == "k2":
        return value
    k2 = _estimate(diff, "k2")
    # Forward: the chosen estimator's value. Backward: k2's gradient, d (log_prob - ref_log_prob).
    return k2 - k2.detach() + value.detach()


def _estimate(diff: torch.Tensor, base: str) -> torch.Tensor:
    if base == "k1":
        return diff
    if base == "abs":
        return diff.abs()
    if base == "k2":
        return 0.5 * diff.square()
    # k3 = r - log r - 1 with r = pi_ref / pi; clamps as verl, so one wild token cannot dominate a batch.
    log_r = torch.clamp(-diff, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(log_r) - log_r - 1.0, min=-10.0, max=10.0)


@attrs.define
class FixedKLController:
    """A constant KL coefficient ``value``."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt."""


@attrs.define
class AdaptiveKLController:
    """``beta <- beta * (1 + clip(KL / target - 1, -0.2, 0.2) * n_steps / horizon)`` (Ziegler et al. 2019)."""

    value: float
    target_kl: float
    horizon: int

    def __attrs_post_init__(self) -> None:
        if self.horizon <= 0:
            raise ValueError(f"adaptive KL controller: horizon must be > 0, got {self.horizon}")
        if self.target_kl <= 0:
            raise ValueError(f"adaptive KL controller: target_kl must be > 0, got {self.target_kl}")

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move ``value`` towards keeping the observed KL at ``target_kl``; ``n_steps``: samples seen."""
        error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


KLController = FixedKLController | AdaptiveKLController


def make_kl_controller(
    type: str = "fixed", kl_coef: float = 0.001, target_kl: float = 0.1, horizon: int = 10000
) -> KLController:
    """The controller verl's ``algorithm.kl_ctrl`` section describes (same field names and defaults)."""
    if type == "fixed":
        return FixedKLController(kl_coef)
    if type == "adaptive":
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"unknown KL controller type {type!r}; use 'fixed' or 'adaptive'")


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl: KLController,
    kind: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL in the reward: ``token_level_rewards = token_level_scores - beta * KL`` on valid tokens.

    All tensors ``[B, T]``. Updates ``kl_ctrl`` with the batch's KL (mean over sequences of each
    sequence's mean token KL) and ``n_steps = B``, as verl does. Returns the rewards and metrics
    ``actor/reward_kl_penalty`` (that KL) and ``actor/reward_kl_penalty_coeff`` (the ``beta`` used).
    """
    beta = kl_ctrl.value
    kld = kl_penalty(old_log_prob, ref_log_prob, kind).detach()
    kld = torch.where(response_mask.bool(), kld, torch.zeros_like(kld))
    rewards = token_level_scores - beta * kld.to(token_level_scores.dtype)
    current_kl = float(masked_mean(kld, response_mask, dim=-1).mean()) if kld.shape[0] else 0.0
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    return rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}

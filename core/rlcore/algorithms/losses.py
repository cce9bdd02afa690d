"""Loss objects the train engines call: ``loss_fn(outputs, micro_batch) -> (loss, metrics)``.

See :data:`rlcore.api.train_engine.LossFn`. ``outputs`` holds what the engine computed for the
micro-batch (``log_probs [b, R]``, ``entropy [b, R]`` or ``values [b, R]``); ``micro_batch`` carries the
batch fields (``old_log_probs``, ``advantages``, ``response_mask``, ``ref_log_prob``, ``returns``,
``values``) and ``meta["global_tokens"]`` / ``meta["global_sequences"]``, the counts over the whole
mini-batch on all data-parallel ranks. Each loss is divided by those counts, so the engine's *sum* of
micro-batch gradients over micro-batches and ranks is the gradient of the mini-batch loss. Without the
counts a micro-batch is normalised by its own. A batch without ``old_log_probs`` is an on-policy update:
the actor loss takes the forward's own detached log-probs as the old ones (see :class:`ActorLoss`).

Both classes are plain attrs data (names and numbers), so they pickle to Ray workers; the policy loss is
looked up by name in the worker's registry at call time.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from rlcore.algorithms.aggregation import agg_loss, check_loss_agg_mode
from rlcore.algorithms.calling import call_with_available
from rlcore.algorithms.kl import check_kl_kind, kl_penalty
from rlcore.algorithms.mismatch import mismatch_means
from rlcore.algorithms.value import value_loss
from rlcore.api.batch import Batch


def _field(source: dict[str, torch.Tensor] | Batch, key: str, where: str, why: str) -> torch.Tensor:
    if key not in source:
        have = sorted(source) if isinstance(source, dict) else source.keys()
        raise KeyError(f"{why} needs {where}[{key!r}]; {where} has {have}")
    return source[key]


def _counts(micro_batch: Batch) -> dict[str, Any]:
    return {
        "global_tokens": micro_batch.meta.get("global_tokens"),
        "global_sequences": micro_batch.meta.get("global_sequences"),
    }


def _policy_loss_fn(name: str) -> Any:
    from rlcore.plugins import registry

    return registry("policy_losses").get(name)


@attrs.define
class ActorLoss:
    """The actor's loss: policy loss ``- entropy_coeff * entropy + kl_loss_coef * KL(pi || pi_ref)``.

    ``policy_loss``: a registered policy loss name (``"vanilla"``, ``"gspo"``, ...). Clip parameters as in
    :mod:`rlcore.algorithms.policy_losses`. The KL term (``use_kl_loss``) uses the ``kl_loss_type``
    estimator of :func:`rlcore.algorithms.kl_penalty` and needs ``ref_log_prob`` in the batch; the
    entropy bonus needs ``outputs["entropy"]``. ``loss_scale_factor``: the constant of
    ``seq-mean-token-sum-norm`` (set it to the maximum response length). ``policy_loss_kwargs``: extra
    arguments of the chosen loss (``clip_cov_ratio``, ``kl_cov_ratio``, ``ppo_kl_coef`` ...); a key the
    loss does not accept is an error.

    Old log-probs: ``micro_batch["old_log_probs"]``, or, when the batch has none, ``log_probs.detach()``.
    The controller leaves them out only for an on-policy update, a single optimizer step over the batch
    (:func:`rlcore.flows.phases.needs_old_log_probs`): the weights are then still those the
    old-log-prob pass would have run with, and the training forward computes the same function, so the
    detached log-probs are the numbers the pass would have given (verl does the same). The ratio is
    exactly 1, so ``actor/ppo_kl`` and ``actor/pg_clipfrac`` are 0.

    Metrics (floats, means over this micro-batch): ``actor/pg_loss`` and the policy loss's own,
    ``actor/entropy`` (whenever ``outputs`` has ``entropy``), ``actor/kl_loss`` and ``actor/kl_coef``
    (with ``use_kl_loss``); without ``old_log_probs`` and with ``rollout_log_probs`` in the batch,
    ``rollout/logprob_diff_mean`` (the mean ``|rollout - trainer|`` log-prob over the micro-batch's
    response tokens), ``rollout/mismatch_k3_kl`` and ``rollout/mismatch_ppl_ratio``
    (:mod:`rlcore.algorithms.mismatch`; the engine averages each over micro-batches).
    """

    policy_loss: str = "vanilla"
    loss_agg_mode: str = "token-mean"
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    clip_ratio_c: float = 3.0
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_type: str = "low_var_kl"
    kl_loss_coef: float = 0.001
    loss_scale_factor: float | None = None
    policy_loss_kwargs: dict[str, Any] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        check_loss_agg_mode(self.loss_agg_mode)
        if self.use_kl_loss:
            check_kl_kind(self.kl_loss_type)
        _policy_loss_fn(self.policy_loss)  # an unknown name fails here, listing the known ones

    @classmethod
    def from_preset(cls, preset: Any, **overrides: Any) -> ActorLoss:
        """The actor loss of an :class:`rlcore.algorithms.presets.AlgorithmPreset`, with ``overrides``."""
        fields = {
            name: getattr(preset, name)
            for name in (
                "policy_loss",
                "loss_agg_mode",
                "clip_ratio",
                "clip_ratio_low",
                "clip_ratio_high",
                "clip_ratio_c",
                "entropy_coeff",
                "use_kl_loss",
                "kl_loss_type",
                "kl_loss_coef",
            )
        }
        fields.update(overrides)
        return cls(**fields)

    def __call__(
        self, outputs: dict[str, torch.Tensor], micro_batch: Batch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        why = f"ActorLoss({self.policy_loss!r})"
        log_prob = _field(outputs, "log_probs", "outputs", why)
        mask = _field(micro_batch, "response_mask", "micro_batch", why)
        counts = _counts(micro_batch)
        agg = {"loss_scale_factor": self.loss_scale_factor, **counts}
        # No old log-probs: an on-policy update, whose old policy is this very forward (class docstring).
        old_log_prob = micro_batch.get("old_log_probs")
        gap = {}
        if old_log_prob is None:
            old_log_prob = log_prob.detach()
            gap = _rollout_gap(micro_batch.get("rollout_log_probs"), old_log_prob, mask)
        available = {
            "old_log_prob": old_log_prob,
            "log_prob": log_prob,
            "advantages": _field(micro_batch, "advantages", "micro_batch", why),
            "response_mask": mask,
            "loss_agg_mode": self.loss_agg_mode,
            "clip_ratio": self.clip_ratio,
            "clip_ratio_low": self.clip_ratio_low,
            "clip_ratio_high": self.clip_ratio_high,
            "clip_ratio_c": self.clip_ratio_c,
            "rollout_is_weights": micro_batch.get("rollout_is_weights"),
            **agg,
        }
        loss, pg_metrics = call_with_available(
            _policy_loss_fn(self.policy_loss),
            available,
            self.policy_loss_kwargs,
            what=f"policy loss {self.policy_loss!r}",
        )
        metrics = {k: float(v) for k, v in {**pg_metrics, **gap}.items()}
        if "entropy" in outputs:
            entropy = outputs["entropy"]
            metrics["actor/entropy"] = float(
                agg_loss(entropy.detach(), mask, self.loss_agg_mode, loss_scale_factor=self.loss_scale_factor)
            )
            if self.entropy_coeff != 0:
                loss = loss - self.entropy_coeff * agg_loss(entropy, mask, self.loss_agg_mode, **agg)
        elif self.entropy_coeff != 0:
            _field(outputs, "entropy", "outputs", f"{why} with entropy_coeff={self.entropy_coeff}")
        if self.use_kl_loss:
            ref = _field(micro_batch, "ref_log_prob", "micro_batch", f"{why} with use_kl_loss")
            kld = kl_penalty(log_prob, ref, self.kl_loss_type)
            loss = loss + self.kl_loss_coef * agg_loss(kld, mask, self.loss_agg_mode, **agg)
            metrics["actor/kl_loss"] = float(
                agg_loss(kld.detach(), mask, self.loss_agg_mode, loss_scale_factor=self.loss_scale_factor)
            )
            metrics["actor/kl_coef"] = float(self.kl_loss_coef)
        return loss, metrics


def _rollout_gap(
    rollout_log_probs: torch.Tensor | None, log_prob: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """The means of :func:`rlcore.algorithms.mismatch.mismatch_means` over the micro-batch, as
    ``rollout/...``: what the skipped old-log-prob pass would have recorded, from the training forward
    instead (``{}`` without rollout log-probs or valid tokens). The quantiles and maximum are left out:
    they do not survive the engine's averaging over micro-batches."""
    if rollout_log_probs is None:
        return {}
    return {f"rollout/{k}": v for k, v in mismatch_means(rollout_log_probs, log_prob, mask).items()}


@attrs.define
class CriticLoss:
    """The critic's clipped value loss (:func:`rlcore.algorithms.value.value_loss`).

    Reads ``outputs["values"]`` (current predictions) and the batch's ``returns``, ``values`` (at
    generation time) and ``response_mask``. Metrics: ``critic/vf_loss`` (mean over this micro-batch),
    ``critic/vf_clipfrac``, ``critic/vpred_mean``.
    """

    cliprange_value: float | None = 0.5
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: float | None = None

    def __attrs_post_init__(self) -> None:
        check_loss_agg_mode(self.loss_agg_mode)

    @classmethod
    def from_preset(cls, preset: Any, **overrides: Any) -> CriticLoss:
        fields = {"cliprange_value": preset.cliprange_value, "loss_agg_mode": preset.loss_agg_mode}
        fields.update(overrides)
        return cls(**fields)

    def __call__(
        self, outputs: dict[str, torch.Tensor], micro_batch: Batch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        why = "CriticLoss"
        vpreds = _field(outputs, "values", "outputs", why)
        args = (
            vpreds,
            _field(micro_batch, "returns", "micro_batch", why),
            _field(micro_batch, "values", "micro_batch", why),
            _field(micro_batch, "response_mask", "micro_batch", why),
            self.cliprange_value,
            self.loss_agg_mode,
        )
        return value_loss(*args, loss_scale_factor=self.loss_scale_factor, **_counts(micro_batch))

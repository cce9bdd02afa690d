"""The algorithm layer: advantage estimators, policy losses, KL, aggregation, DAPO and on-policy
distillation pieces, and presets.

Estimators and policy losses live in plugin registries (``advantage_estimators``, ``policy_losses``);
the built-ins are registered by :mod:`rlcore.builtin.algorithms` through the same hooks a third-party
plugin implements, and are looked up by name::

    from rlcore import algorithms

    adv, ret = algorithms.compute_advantage("grpo", token_level_rewards=r, response_mask=m, index=uids)
    loss, metrics = algorithms.get_policy_loss("vanilla")(old_lp, lp, adv, m, "token-mean", clip_ratio=0.2)

Formulas and sources: ``docs/algorithms.md``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from rlcore.algorithms.presets import PRESETS, AlgorithmPreset, get_preset

#: Public name -> the submodule defining it. Imported on first access, so that importing the package
#: (for presets and the accessors, e.g. in config validation) does not import torch.
_LAZY = {
    **dict.fromkeys(
        ("LOSS_AGG_MODES", "agg_loss", "global_batch_counts", "masked_mean", "masked_whiten"),
        "rlcore.algorithms.aggregation",
    ),
    "call_with_available": "rlcore.algorithms.calling",
    **dict.fromkeys(
        (
            "DynamicSampler",
            "DynamicSamplingExhausted",
            "apply_overlong_penalty",
            "filter_groups",
            "group_metric",
            "overlong_penalty",
        ),
        "rlcore.algorithms.dapo",
    ),
    **dict.fromkeys(("distill_metrics", "opd_advantages"), "rlcore.algorithms.distill"),
    **dict.fromkeys(("entropy_from_logits", "entropy_loss"), "rlcore.algorithms.entropy"),
    **dict.fromkeys(
        (
            "KL_PENALTY_KINDS",
            "AdaptiveKLController",
            "FixedKLController",
            "apply_kl_penalty",
            "kl_penalty",
            "make_kl_controller",
        ),
        "rlcore.algorithms.kl",
    ),
    **dict.fromkeys(("ActorLoss", "CriticLoss"), "rlcore.algorithms.losses"),
    "value_loss": "rlcore.algorithms.value",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rlcore.algorithms' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


ADVANTAGE_ESTIMATORS = "advantage_estimators"
POLICY_LOSSES = "policy_losses"


def _registry(key: str) -> Any:
    from rlcore.plugins import registry

    return registry(key)


def get_advantage_estimator(name: str) -> Callable[..., Any]:
    """The estimator registered as ``name``; an unknown name raises ``RegistryError`` listing the known ones."""
    return _registry(ADVANTAGE_ESTIMATORS).get(name)


def get_policy_loss(name: str) -> Callable[..., Any]:
    """The policy loss registered as ``name``; an unknown name raises ``RegistryError`` listing the known ones."""
    return _registry(POLICY_LOSSES).get(name)


def compute_advantage(name: str, **inputs: Any) -> Any:
    """Run estimator ``name`` on whichever of ``inputs`` it names (``None`` values count as absent).

    ``inputs`` use verl's keywords: ``token_level_rewards``, ``response_mask``, ``index``, ``values``,
    ``gamma``, ``lam``, ``epsilon``, ``norm_adv_by_std_in_grpo``, ``reward_baselines`` ... Returns
    ``(advantages, returns)``, each ``[B, T]``.
    """
    from rlcore.algorithms.calling import call_with_available

    available = {k: v for k, v in inputs.items() if v is not None}
    return call_with_available(get_advantage_estimator(name), available, what=f"advantage estimator {name!r}")


def register_advantage_estimator(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering an estimator in this process (scripts, notebooks, tests).

    A package should implement the ``register_advantage_estimators`` hook instead: hooks run in every Ray
    worker, a decorator only where its module was imported. A taken name is an error.
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        _registry(ADVANTAGE_ESTIMATORS).register(name, fn, plugin=f"{fn.__module__} (decorator)")
        return fn

    return decorate


def register_policy_loss(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering a policy loss in this process; see :func:`register_advantage_estimator`."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        _registry(POLICY_LOSSES).register(name, fn, plugin=f"{fn.__module__} (decorator)")
        return fn

    return decorate


__all__ = [
    "KL_PENALTY_KINDS",
    "LOSS_AGG_MODES",
    "PRESETS",
    "ActorLoss",
    "AdaptiveKLController",
    "AlgorithmPreset",
    "CriticLoss",
    "DynamicSampler",
    "DynamicSamplingExhausted",
    "FixedKLController",
    "agg_loss",
    "apply_kl_penalty",
    "apply_overlong_penalty",
    "call_with_available",
    "compute_advantage",
    "distill_metrics",
    "entropy_from_logits",
    "entropy_loss",
    "filter_groups",
    "get_advantage_estimator",
    "get_policy_loss",
    "get_preset",
    "global_batch_counts",
    "group_metric",
    "kl_penalty",
    "make_kl_controller",
    "masked_mean",
    "masked_whiten",
    "opd_advantages",
    "overlong_penalty",
    "register_advantage_estimator",
    "register_policy_loss",
    "value_loss",
]

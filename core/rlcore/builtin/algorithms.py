"""Built-in advantage estimators and policy losses (default plugin).

Registered lazily as ``"module:function"`` strings, so loading plugins does not import torch; the
function is imported on first lookup. Formulas and sources: ``docs/algorithms.md``.
"""

from rlcore import hookimpl

ADVANTAGE_ESTIMATORS = (
    "gae",
    "grpo",
    "grpo_passk",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "opo",
    "gpg",
)

POLICY_LOSSES = ("vanilla", "gspo", "gpg", "cispo", "clip_cov", "kl_cov", "geo_mean")


@hookimpl
def register_advantage_estimators(register):
    for name in ADVANTAGE_ESTIMATORS:
        register(name, f"rlcore.algorithms.advantages:{name}")


@hookimpl
def register_policy_losses(register):
    for name in POLICY_LOSSES:
        register(name, f"rlcore.algorithms.policy_losses:{name}")

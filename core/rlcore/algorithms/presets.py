"""Algorithm presets: an estimator, a policy loss, KL settings and the roles they need, under one name.

Values follow verl's example recipes, so ``algorithm=dapo`` here trains as verl's DAPO recipe does. A
preset is data: the controller's ``Algorithm`` classes read it, and the user's config may override any
field (``attrs.evolve(get_preset("grpo"), kl_loss_coef=0.0)``).

Importing this module is cheap (no torch).
"""

from __future__ import annotations

import difflib

import attrs

from rlcore.plugins.registries import RegistryError

_ROLES_BY_ESTIMATOR = {"gae": "critic"}


@attrs.frozen
class KLControl:
    """verl's ``algorithm.kl_ctrl``: the coefficient of a KL penalty in the reward."""

    type: str = attrs.field(default="fixed", validator=attrs.validators.in_(("fixed", "adaptive")))
    kl_coef: float = 0.001
    target_kl: float = 0.1
    horizon: int = 10000


@attrs.frozen
class FilterGroups:
    """DAPO dynamic sampling: drop groups whose ``metric`` is equal for all responses (verl's
    ``algorithm.filter_groups``); ``max_num_gen_batches <= 0`` means no limit."""

    enable: bool = False
    metric: str = "acc"
    max_num_gen_batches: int = 10


@attrs.frozen
class OverlongBuffer:
    """DAPO overlong reward shaping (verl's ``reward_model.overlong_buffer``): the last ``len`` tokens before
    the maximum response length cost up to ``penalty_factor`` reward."""

    enable: bool = False
    len: int = 4096
    penalty_factor: float = 1.0


@attrs.frozen
class AlgorithmPreset:
    """One algorithm's defaults.

    ``adv_estimator`` / ``policy_loss``: registry names. KL regularisation takes two forms: a loss term
    (``use_kl_loss``, ``kl_loss_type``, ``kl_loss_coef``) or a reward penalty (``use_kl_in_reward``,
    ``kl_penalty`` estimator, ``kl_ctrl`` coefficient). ``needs_critic``: a value model is trained (GAE);
    ``needs_reward_baseline``: a greedy response per prompt is scored as the baseline (ReMax).
    ``needs_reference`` follows from the KL settings.
    """

    name: str
    adv_estimator: str
    policy_loss: str = "vanilla"
    loss_agg_mode: str = "token-mean"
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    clip_ratio: float = 0.2
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_type: str = "low_var_kl"
    kl_loss_coef: float = 0.001
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLControl = KLControl()
    cliprange_value: float = 0.5
    needs_critic: bool = False
    needs_reward_baseline: bool = False
    filter_groups: FilterGroups = FilterGroups()
    overlong_buffer: OverlongBuffer = OverlongBuffer()
    opd_kl_coef: float = 1.0
    opd_reward_weight: float = 0.0

    def __attrs_post_init__(self) -> None:
        if _ROLES_BY_ESTIMATOR.get(self.adv_estimator) == "critic" and not self.needs_critic:
            raise ValueError(
                f"preset {self.name!r}: estimator {self.adv_estimator!r} needs a critic (needs_critic)"
            )
        if self.adv_estimator == "remax" and not self.needs_reward_baseline:
            raise ValueError(f"preset {self.name!r}: estimator 'remax' needs greedy reward baselines")
        for field in ("opd_kl_coef", "opd_reward_weight"):
            if getattr(self, field) < 0:
                raise ValueError(f"{field} must be >= 0, got {getattr(self, field)!r}")

    @property
    def needs_reference(self) -> bool:
        """A reference policy is needed whenever a KL term is on."""
        return self.use_kl_loss or self.use_kl_in_reward

    @property
    def roles(self) -> tuple[str, ...]:
        """Worker roles beyond ``actor`` and ``rollout`` (:attr:`rlcore.api.Algorithm.roles`)."""
        return tuple(
            role
            for role, needed in (("critic", self.needs_critic), ("reference", self.needs_reference))
            if needed
        )


PRESETS: dict[str, AlgorithmPreset] = {
    # PPO with a critic and GAE; verl's defaults (no KL, clip 0.2, dual-clip 3).
    "ppo": AlgorithmPreset(name="ppo", adv_estimator="gae", needs_critic=True),
    # GRPO as in verl's examples: KL as a k3 loss term, no KL in the reward.
    "grpo": AlgorithmPreset(
        name="grpo", adv_estimator="grpo", use_kl_loss=True, kl_loss_type="low_var_kl", kl_loss_coef=0.001
    ),
    # DAPO recipe: clip-higher, token-level loss, no KL, dynamic sampling, overlong shaping.
    "dapo": AlgorithmPreset(
        name="dapo",
        adv_estimator="grpo",
        loss_agg_mode="token-mean",
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        clip_ratio_c=10.0,
        kl_ctrl=KLControl(kl_coef=0.0),
        kl_loss_coef=0.0,
        filter_groups=FilterGroups(enable=True, metric="acc", max_num_gen_batches=10),
        overlong_buffer=OverlongBuffer(enable=True, len=4096, penalty_factor=1.0),
    ),
    # RLOO and REINFORCE++ examples: KL (k1) in the reward with coefficient 0.001.
    "rloo": AlgorithmPreset(name="rloo", adv_estimator="rloo", use_kl_in_reward=True, kl_penalty="kl"),
    "reinforce_plus_plus": AlgorithmPreset(
        name="reinforce_plus_plus",
        adv_estimator="reinforce_plus_plus",
        use_kl_in_reward=True,
        kl_penalty="kl",
    ),
    # GSPO: sequence-level ratio, sequence-mean loss and the paper's tiny clip ranges; no KL.
    "gspo": AlgorithmPreset(
        name="gspo",
        adv_estimator="grpo",
        policy_loss="gspo",
        loss_agg_mode="seq-mean-token-mean",
        clip_ratio_low=3e-4,
        clip_ratio_high=4e-4,
        clip_ratio_c=10.0,
        kl_ctrl=KLControl(kl_coef=0.0),
        kl_loss_coef=0.0,
    ),
    # ReMax: greedy-response baseline, KL (k1) in the reward.
    "remax": AlgorithmPreset(
        name="remax",
        adv_estimator="remax",
        use_kl_in_reward=True,
        kl_penalty="kl",
        needs_reward_baseline=True,
    ),
    # On-policy distillation: the per-token reverse KL to the teacher is the advantage (no critic, no
    # group); the task reward joins with opd_reward_weight (GRPO's group baseline when it does). No KL to
    # the student's own start: the teacher is the anchor. PPO's clip as GRPO's, for minibatched updates.
    "opd": AlgorithmPreset(name="opd", adv_estimator="grpo", opd_kl_coef=1.0, opd_reward_weight=0.0),
}


def get_preset(name: str) -> AlgorithmPreset:
    """The preset called ``name``; an unknown name lists the presets."""
    try:
        return PRESETS[name]
    except KeyError:
        close = difflib.get_close_matches(name, PRESETS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise RegistryError(
            f"unknown algorithm preset {name!r}. Presets: {', '.join(sorted(PRESETS))}.{hint}"
        ) from None

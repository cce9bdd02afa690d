"""Registration by name, presets, and the documentation of every registered name."""

import pathlib
import re

import pytest
import torch
from rlcore import algorithms
from rlcore.algorithms import PRESETS, get_preset
from rlcore.api import Batch
from rlcore.builtin import algorithms as builtin
from rlcore.plugins import registry, reset_plugins
from rlcore.plugins.registries import RegistryError

DOCS = pathlib.Path(__file__).resolve().parents[3] / "docs" / "algorithms.md"


@pytest.fixture
def fresh_registries():
    """Registrations a test makes vanish afterwards (the next lookup reloads every plugin)."""
    reset_plugins()
    yield
    reset_plugins()


def test_builtins_are_registered_by_the_default_plugin():
    for key, names in (
        ("advantage_estimators", builtin.ADVANTAGE_ESTIMATORS),
        ("policy_losses", builtin.POLICY_LOSSES),
    ):
        reg = registry(key)
        for name in names:
            assert reg.entry(name).plugin == "rlcore.builtin.algorithms"
            assert callable(reg.get(name))
    assert algorithms.get_advantage_estimator("grpo").__module__ == "rlcore.algorithms.advantages"
    assert algorithms.get_policy_loss("vanilla").__module__ == "rlcore.algorithms.policy_losses"


def test_unknown_names_list_the_known_ones():
    with pytest.raises(RegistryError) as err:
        algorithms.get_advantage_estimator("ppo")
    for name in builtin.ADVANTAGE_ESTIMATORS:
        assert name in str(err.value)
    with pytest.raises(RegistryError, match="Did you mean 'gspo'"):
        algorithms.get_policy_loss("gpso")


def test_registering_a_taken_name_is_an_error(fresh_registries):
    with pytest.raises(RegistryError, match="registered twice.*rlcore.builtin.algorithms"):

        @algorithms.register_advantage_estimator("grpo")
        def my_grpo(token_level_rewards, response_mask, index):
            return token_level_rewards, token_level_rewards

    with pytest.raises(RegistryError, match="'vanilla' is registered twice"):
        registry("policy_losses").registrar("third_party")("vanilla", lambda **kw: None)
    # The original stays in place.
    assert algorithms.get_advantage_estimator("grpo").__module__ == "rlcore.algorithms.advantages"


def test_a_new_name_works_everywhere_and_only_once(fresh_registries):
    @algorithms.register_advantage_estimator("constant_one")
    def constant_one(token_level_rewards, response_mask, **kwargs):
        ones = torch.ones_like(token_level_rewards) * response_mask
        return ones, ones

    @algorithms.register_policy_loss("neg_logp")
    def neg_logp(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", **kwargs):
        return algorithms.agg_loss(-log_prob, response_mask, loss_agg_mode), {}

    rewards, mask = torch.zeros(2, 3), torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv, _ = algorithms.compute_advantage(
        "constant_one", token_level_rewards=rewards, response_mask=mask, index=[0, 1]
    )
    assert adv.tolist() == [[1, 1, 0], [1, 0, 0]]
    loss_fn = algorithms.ActorLoss(policy_loss="neg_logp")
    lp = torch.tensor([[-1.0, -2.0, -9.0], [-3.0, -9.0, -9.0]])
    batch = Batch({"old_log_probs": lp, "advantages": adv, "response_mask": mask})
    assert loss_fn({"log_probs": lp}, batch)[0].item() == pytest.approx(2.0)
    with pytest.raises(RegistryError, match="registered twice"):
        algorithms.register_policy_loss("neg_logp")(neg_logp)


# ----------------------------------------------------------------------------------- presets
def test_presets_name_registered_components_and_roles():
    assert set(PRESETS) == {"ppo", "grpo", "dapo", "rloo", "reinforce_plus_plus", "gspo", "remax", "opd"}
    for name, preset in PRESETS.items():
        assert preset.name == name
        algorithms.get_advantage_estimator(preset.adv_estimator)
        algorithms.get_policy_loss(preset.policy_loss)
        assert preset.loss_agg_mode in algorithms.LOSS_AGG_MODES
        assert (
            preset.kl_loss_type in algorithms.KL_PENALTY_KINDS
            and preset.kl_penalty in algorithms.KL_PENALTY_KINDS
        )
    assert get_preset("ppo").roles == ("critic",)
    assert get_preset("grpo").roles == ("reference",)
    assert get_preset("dapo").roles == () and get_preset("gspo").roles == ()
    assert get_preset("rloo").roles == ("reference",) and get_preset("reinforce_plus_plus").roles == (
        "reference",
    )
    assert get_preset("remax").needs_reward_baseline and get_preset("remax").roles == ("reference",)
    assert get_preset("opd").roles == ()  # its teacher is the flow's role (rlcore.flows.opd.OPD.roles)


def test_preset_values_follow_verl_recipes():
    grpo = get_preset("grpo")
    assert (grpo.use_kl_loss, grpo.kl_loss_type, grpo.kl_loss_coef, grpo.use_kl_in_reward) == (
        True,
        "low_var_kl",
        0.001,
        False,
    )
    dapo = get_preset("dapo")
    assert (dapo.clip_ratio_low, dapo.clip_ratio_high, dapo.loss_agg_mode) == (0.2, 0.28, "token-mean")
    assert dapo.filter_groups.enable and dapo.filter_groups.max_num_gen_batches == 10
    assert dapo.overlong_buffer.enable and dapo.overlong_buffer.len == 4096
    assert not dapo.use_kl_loss and not dapo.use_kl_in_reward
    gspo = get_preset("gspo")
    assert (gspo.policy_loss, gspo.loss_agg_mode, gspo.clip_ratio_low, gspo.clip_ratio_high) == (
        "gspo",
        "seq-mean-token-mean",
        3e-4,
        4e-4,
    )
    for name in ("rloo", "reinforce_plus_plus", "remax"):
        preset = get_preset(name)
        assert preset.use_kl_in_reward and preset.kl_penalty == "kl" and preset.kl_ctrl.kl_coef == 0.001


def test_preset_errors():
    with pytest.raises(RegistryError, match="Did you mean 'rloo'"):
        get_preset("rlo")
    with pytest.raises(RegistryError, match="dapo, grpo, gspo, opd, ppo"):
        get_preset("trpo")
    with pytest.raises(ValueError, match="needs a critic"):
        algorithms.AlgorithmPreset(name="x", adv_estimator="gae")
    with pytest.raises(ValueError, match="greedy reward baselines"):
        algorithms.AlgorithmPreset(name="x", adv_estimator="remax")


# ----------------------------------------------------------------------------------- docs
def documented_names():
    """Names in backticks on a heading line or in the first cell of a table row of docs/algorithms.md."""
    names = set()
    for line in DOCS.read_text().splitlines():
        if line.startswith("#"):
            names.update(re.findall(r"`([^`]+)`", line))
        elif line.startswith("|"):
            first_cell = line.split("|")[1]
            names.update(re.findall(r"`([^`]+)`", first_cell))
    return names


def test_every_registered_name_is_documented():
    documented = documented_names()
    for key in ("advantage_estimators", "policy_losses"):
        builtin_names = [e.name for e in registry(key).entries() if e.plugin == "rlcore.builtin.algorithms"]
        assert builtin_names, key
        missing = sorted(set(builtin_names) - documented)
        assert not missing, f"{key} missing from {DOCS}: {missing}"
    for group in (algorithms.LOSS_AGG_MODES, algorithms.KL_PENALTY_KINDS, tuple(PRESETS)):
        assert not sorted(set(group) - documented), sorted(set(group) - documented)

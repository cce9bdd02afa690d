"""Config loading: defaults <- YAML <- overrides, and every kind of invalid input with its message."""

import pytest
from rlcore.config import ConfigError, load_config, to_dict, to_yaml
from rlcore.config.schema import RLConfig


def test_defaults_structure_and_plugin_sections():
    from rlcore.tasks.copy_word import RECIPE

    config = load_config(engine="fsdp", rollout="vllm")
    assert isinstance(config, RLConfig)
    # Without training files the built-in task's recipe sits under the user's settings ...
    assert config.trainer.total_steps == RECIPE["trainer"]["total_steps"]
    # ... and with the user's own data, the schema's defaults hold.
    own = load_config(engine="fsdp", rollout="vllm", overrides=["data.train_files=a.jsonl"])
    assert own.trainer.total_steps == RLConfig().trainer.total_steps
    assert set(config.plugins) == {"fsdp", "vllm"}
    data = to_dict(config)
    assert data["fsdp"]["cpu_offload"] is False and "plugins" not in data


def test_file_then_overrides_then_flags(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "engine: fake\ntrainer:\n  total_steps: 7\n  seed: 3\nrollout:\n  n: 2\nfsdp:\n  cpu_offload: true\n"
    )
    config = load_config(path, ["trainer.total_steps=3", "actor.optim.lr=0.5"], engine="fsdp", rollout="hf")
    assert config.engine == "fsdp"  # the flag wins over the file
    assert config.trainer.total_steps == 3 and config.trainer.seed == 3
    assert config.actor.optim.lr == 0.5 and config.rollout.n == 2
    assert config.rollout.engine == "hf"
    assert config.plugins["fsdp"].cpu_offload is True


def test_yaml_round_trip(tmp_path):
    config = load_config(engine="fsdp", rollout="vllm", overrides=["trainer.total_steps=5"])
    path = tmp_path / "resolved.yaml"
    path.write_text(to_yaml(config))
    assert to_dict(load_config(path)) == to_dict(config)


def test_unknown_key_names_path_valid_keys_and_closest_match():
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["trainer.totl_steps=3"], engine="fsdp", rollout="vllm")
    message = str(err.value)
    assert "unknown key 'trainer.totl_steps'" in message
    assert "Did you mean 'trainer.total_steps'?" in message
    assert "save_freq" in message  # the valid keys are listed


def test_unknown_nested_and_plugin_keys():
    with pytest.raises(ConfigError, match=r"'actor.optim.lrr'.*Did you mean 'actor.optim.lr'"):
        load_config(overrides=["actor.optim.lrr=1"])
    with pytest.raises(ConfigError, match=r"'fsdp.cpu_offlod'.*Did you mean 'fsdp.cpu_offload'"):
        load_config(overrides=["fsdp.cpu_offlod=true"], engine="fsdp")
    with pytest.raises(ConfigError, match=r"unknown key 'trainr'. Did you mean 'trainer'"):
        load_config(overrides=["trainr.seed=1"])


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("trainer.total_steps=abc", r"'trainer.total_steps': expected int, got str 'abc'"),
        ("trainer.total_steps=3.0", r"'trainer.total_steps': expected int, got float 3.0"),
        ("trainer.val_before_train=1", r"'trainer.val_before_train': expected bool, got int 1"),
        ("trainer.total_steps=0", r"'trainer.total_steps': must be >= 1, got 0"),
        ("trainer.placement=nowhere", r"'trainer.placement': must be one of auto, colocated, split"),
        ("rollout.n=2.5", r"'rollout.n': expected int, got float 2.5"),
        ("fsdp.cpu_offload=maybe", r"'fsdp.cpu_offload': expected bool, got str 'maybe'"),
    ],
)
def test_wrong_types_and_values_name_the_key(override, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(overrides=[override], engine="fsdp")


def test_missing_required_value():
    with pytest.raises(ConfigError, match=r"missing or unresolvable value at key 'model.path'"):
        load_config(overrides=["model.path=???"])


def test_bad_files_and_overrides(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: [1, 2\n")
    with pytest.raises(ConfigError, match=f"'{bad}' is not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("3\n")
    with pytest.raises(ConfigError, match="mapping of sections"):
        load_config(scalar)
    with pytest.raises(ConfigError, match="must look like key.path=value"):
        load_config(overrides=["trainer.total_steps"])


def test_single_path_is_a_list_of_one():
    config = load_config(overrides=["data.train_files=a.parquet", "data.val_files=[b.jsonl,c.jsonl]"])
    assert config.data.train_files == ["a.parquet"]
    assert config.data.val_files == ["b.jsonl", "c.jsonl"]


def test_unknown_engine_lists_installed_ones():
    with pytest.raises(ConfigError, match=r"'engine': unknown train engine 'nosuch'. Installed: .*fsdp"):
        load_config(engine="nosuch")


def test_yaml_exponent_floats_are_floats(tmp_path):
    # PyYAML alone reads `1e-6` as a string; users write it that way in verl configs.
    path = tmp_path / "lr.yaml"
    path.write_text("actor:\n  optim:\n    lr: 1e-6\n")
    assert load_config(path).actor.optim.lr == 1e-6


def test_unparsable_override_is_a_config_error():
    with pytest.raises(
        ConfigError, match=r"override 'data.train_files=\[\$\{oc.env:HOME\}/x\]' could not be applied"
    ):
        load_config(overrides=["data.train_files=[${oc.env:HOME}/x]"])


# -- names of registered components -------------------------------------------------------------
#: override -> what the one-line error must say: key path, bad value, an installed name, the suggestion.
BAD_NAMES = {
    "engine=fsdpp": "'engine': unknown train engine 'fsdpp'. Installed: fake, fsdp",
    "rollout.engine=hff": "'rollout.engine': unknown rollout engine 'hff'. Installed: fake, hf",
    "algorithm.name=grpx": "'algorithm.name': unknown algorithm 'grpx'. Installed: dapo, grpo",
    "algorithm.adv_estimator=gaee": "'algorithm.adv_estimator': unknown advantage estimator 'gaee'. Installed: gae",
    "algorithm.policy_loss=vanila": "'algorithm.policy_loss': unknown policy loss 'vanila'. Installed: cispo",
    "reward.provider=rules": "'reward.provider': unknown reward provider 'rules'. Installed: agent, rule",
    "transport.name=rayy": "'transport.name': unknown weight transport 'rayy'. Installed: broadcast",
    # Installed device platforms include plugins (ascend, rocm) and the test platform: only the prefix.
    "trainer.device=cpuu": "'trainer.device': unknown device platform 'cpuu'. Installed: ",
}
SUGGESTED = {
    "engine": "fsdp",
    "rollout.engine": "hf",
    "algorithm.name": "grpo",
    "algorithm.adv_estimator": "gae",
    "algorithm.policy_loss": "vanilla",
    "reward.provider": "rule",
    "transport.name": "ray",
    "trainer.device": "cpu",
}


@pytest.mark.parametrize("override", sorted(BAD_NAMES))
def test_unknown_component_name_names_key_value_installed_and_closest(override):
    key = override.partition("=")[0]
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override])
    first = str(err.value).splitlines()[0]  # one error: on the first line, which a terminal shows first
    assert first.startswith(f"invalid config: {BAD_NAMES[override]}")
    assert first.endswith(f"Did you mean {SUGGESTED[key]!r}?")


def test_auto_is_allowed_where_the_run_resolves_it():
    # Core's transports among the installed ones (plugins add more, e.g. rlcore-ascend's hccl).
    with pytest.raises(
        ConfigError,
        match=r"'transport.name': .*Installed: broadcast, ([\w-]+, )*inprocess, ([\w-]+, )*ray(, [\w-]+)*; or auto",
    ):
        load_config(overrides=["transport.name=nope"])
    config = load_config(overrides=["transport.name=auto", "trainer.device=auto", "rollout.engine=auto"])
    assert (config.transport.name, config.trainer.device) == ("auto", "auto")


def test_several_bad_names_are_reported_together():
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["algorithm.name=nope", "reward.provider=nope", "trainer.device=nope"])
    lines = str(err.value).splitlines()
    assert lines[0] == "invalid config:"
    keys = [line.split("'")[1] for line in lines[1:] if line.startswith("  '")]
    assert keys == ["algorithm.name", "reward.provider", "trainer.device"]
    # A device platform may come from a plugin: the advice follows its line, indented under it.
    assert lines[-1] == "    If it is published as a plugin, install it: pip install rlcore-nope"


def test_defaults_and_every_registered_name_pass():
    from rlcore.plugins import registry

    config = load_config()
    assert (config.algorithm.name, config.algorithm.adv_estimator, config.reward.provider) == (
        "grpo",
        None,
        "rule",
    )
    for key, registry_key in (
        ("algorithm.name", "algorithms"),
        ("algorithm.adv_estimator", "advantage_estimators"),
        ("algorithm.policy_loss", "policy_losses"),
        ("transport.name", "weight_transports"),
        ("trainer.device", "device_platforms"),
    ):
        for name in registry(registry_key).names():
            load_config(overrides=[f"{key}={name}"])


def test_a_name_registered_in_the_runs_registry_is_accepted():
    from rlcore.algorithms import register_advantage_estimator
    from rlcore.plugins import registry

    with pytest.raises(ConfigError, match="'my_estimator'"):
        load_config(overrides=["algorithm.adv_estimator=my_estimator"])
    register_advantage_estimator("my_estimator")(lambda token_level_rewards, response_mask: None)
    try:
        assert (
            load_config(overrides=["algorithm.adv_estimator=my_estimator"]).algorithm.adv_estimator
            == "my_estimator"
        )
    finally:
        registry("advantage_estimators").remove_plugin(f"{__name__} (decorator)")


def test_wrong_type_for_a_name_is_a_type_error_not_a_lookup():
    with pytest.raises(ConfigError, match=r"'algorithm.name': expected str, got int 5"):
        load_config(overrides=["algorithm.name=5"])


# -- what `rlcore train` checks before it makes the run directory ---------------------------------
def test_check_run_passes_the_defaults_and_a_ppo_run():
    from rlcore.trainer.preflight import check_run

    check_run(load_config())
    check_run(load_config(overrides=["algorithm.name=ppo", "transport.name=broadcast", "trainer.device=cpu"]))


def test_check_run_refuses_what_the_hybrid_placement_cannot_do():
    from rlcore.trainer.preflight import check_run

    check_run(
        load_config(overrides=["trainer.placement=hybrid", "actor.world_size=2", "rollout.num_engines=2"])
    )
    config = load_config(
        overrides=[
            "trainer.placement=hybrid",
            "rollout.tensor_parallel_size=2",
            "rollout.num_engines=2",
            "transport.name=ray",
        ]
    )
    with pytest.raises(ConfigError) as err:
        check_run(config)
    message = str(err.value)
    assert "'rollout.tensor_parallel_size': with trainer.placement=hybrid" in message
    assert "'rollout.num_engines': with trainer.placement=hybrid" in message and "(got 2)" in message
    assert "'transport.name': with trainer.placement=hybrid" in message and "'ray'" in message


def test_check_run_refuses_lora_on_an_engine_without_adapters():
    from rlcore.trainer.preflight import check_run

    check_run(load_config(overrides=["actor.lora.rank=8"]))  # fsdp trains adapters
    with pytest.raises(
        ConfigError, match=r"'actor\.lora\.rank': 8, but train engine 'fake'.*does not train LoRA"
    ):
        check_run(load_config(overrides=["engine=fake", "rollout.engine=fake", "actor.lora.rank=8"]))
    with pytest.raises(ConfigError, match=r"actor\.lora\.sync.*must be one of auto, adapter, merged"):
        load_config(overrides=["actor.lora.rank=8", "actor.lora.sync=half"])
    with pytest.raises(ConfigError, match=r"actor\.lora\.target_modules"):
        load_config(overrides=["actor.lora.rank=8", "actor.lora.target_modules=[]"])


def test_check_run_checks_the_distillation_teacher(tmp_path, tiny_model_path):
    import json

    from rlcore.trainer.preflight import check_run

    opd = ["algorithm.name=opd"]
    check_run(load_config(overrides=[*opd, f"teacher.model_path={tiny_model_path}"]))
    check_run(load_config(overrides=[*opd, "teacher.model_path=builtin:tiny"]))  # built when the run starts
    with pytest.raises(
        ConfigError, match=r"'teacher\.model_path': algorithm\.name=opd distils from a teacher"
    ):
        check_run(load_config(overrides=opd))
    with pytest.raises(ConfigError, match=r"'teacher\.model_path': .*no-teacher' does not exist"):
        check_run(load_config(overrides=[*opd, f"teacher.model_path={tmp_path / 'no-teacher'}"]))
    classifier = tmp_path / "rm"
    classifier.mkdir()
    (classifier / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForSequenceClassification"]}))
    with pytest.raises(ConfigError, match=r"holds Qwen2ForSequenceClassification, not a \.\.\.ForCausalLM"):
        check_run(load_config(overrides=[*opd, f"teacher.model_path={classifier}"]))
    with pytest.raises(
        ConfigError, match=r"'teacher\.model_path': set to .*algorithm\.name=grpo uses no teacher"
    ):
        check_run(load_config(overrides=[f"teacher.model_path={tiny_model_path}"]))
    with pytest.raises(ConfigError, match=r"teacher\.world_size.*>= 1"):
        load_config(overrides=[*opd, "teacher.world_size=0"])


def test_check_run_names_every_problem_it_finds(tmp_path):
    from rlcore.trainer.preflight import check_run

    config = load_config(
        overrides=[
            f"data.train_files=[{tmp_path / 'missing.jsonl'}]",
            "data.val_files=[builtin:copy_word/tset.jsonl]",
            "algorithm.adv_estimator=gae",  # needs a critic, which grpo has not
            "trainer.loggers=[console,jsnol]",
            f"model.path={tmp_path / 'no-model'}",
            f"reward.custom_function_path={tmp_path}",
        ]
    )
    with pytest.raises(ConfigError) as err:
        check_run(config)
    message = str(err.value)
    for expected in (
        "'algorithm': preset 'grpo': estimator 'gae' needs a critic",
        "'trainer.loggers': unknown logger(s) ['jsnol']",
        "'model.path': model folder",
        f"'data.train_files[0]': '{tmp_path / 'missing.jsonl'}' does not exist",
        "'data.val_files[0]': 'builtin:copy_word/tset.jsonl': task 'copy_word' has no split 'tset'",
        f"'reward.custom_function_path': '{tmp_path}' is a directory, not a file",
    ):
        assert expected in message


def test_a_selected_section_checks_the_rest_of_the_run(monkeypatch):
    """A plugin section's optional ``check_run(config)`` sees the resolved run config; its messages are
    config errors, listed with the others, raised at load time (docs/plugins.md, section 4)."""
    import attrs
    from rlcore.config import loader

    @attrs.define
    class Sharded:
        shards: int = 1

        def check_run(self, config) -> list[str]:
            world = config.actor.world_size
            return (
                [] if world % self.shards == 0 else [f"actor.world_size={world} vs toy.shards={self.shards}"]
            )

    monkeypatch.setattr(loader, "plugin_sections", lambda engine, rollout: {"toy": Sharded})
    ok = load_config(engine="fsdp", rollout="hf", overrides=["toy.shards=2", "actor.world_size=4"])
    assert ok.plugins["toy"].shards == 2
    with pytest.raises(ConfigError, match=r"actor.world_size=3 vs toy.shards=2") as err:
        load_config(engine="fsdp", rollout="hf", overrides=["toy.shards=2", "actor.world_size=3"])
    assert str(err.value).startswith("invalid config: ")
    with pytest.raises(ConfigError) as both:  # listed with the other errors
        load_config(
            engine="fsdp",
            rollout="hf",
            overrides=["toy.shards=2", "actor.world_size=3", "reward.provider=nope"],
        )
    assert "toy.shards=2" in str(both.value) and "nope" in str(both.value)

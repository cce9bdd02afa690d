"""The `rlcore` command line, run as users run it (a subprocess of the installed console script)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

#: The console script of the environment running pytest: `make test` does not put `.venv/bin` on PATH,
#: and a missing script must fail these tests, not skip them.
RLCORE = Path(sys.executable).with_name("rlcore")


def run(*args, env=None):
    assert RLCORE.is_file(), f"the rlcore console script is not installed next to {sys.executable}"
    return subprocess.run([str(RLCORE), *args], capture_output=True, text=True, timeout=120, env=env)


def test_config_prints_merged_config():
    result = run("config", "--engine", "fsdp", "--rollout", "vllm", "trainer.total_steps=3")
    assert result.returncode == 0, result.stderr
    assert "total_steps: 3" in result.stdout
    assert "\nfsdp:\n" in result.stdout and "\nvllm:\n" in result.stdout


def test_config_typo_exits_nonzero_with_suggestion():
    result = run("config", "--engine", "fsdp", "--rollout", "vllm", "trainer.totl_steps=3")
    assert result.returncode != 0
    assert "trainer.totl_steps" in result.stderr
    assert "trainer.total_steps" in result.stderr
    assert "Traceback" not in result.stderr


def test_config_json_validate_and_defaults():
    data = json.loads(run("config", "--json", "rollout.n=3").stdout)
    assert data["rollout"]["n"] == 3
    assert run("config", "--validate").stdout.strip() == "config is valid"
    assert "cpu_offload" in run("config", "--defaults", "--engine", "fsdp").stdout


def test_train_unknown_engine_lists_installed():
    result = run("train", "--engine", "nosuch")
    assert result.returncode != 0
    assert "unknown train engine 'nosuch'" in result.stderr
    assert "fsdp" in result.stderr
    assert "pip install rlcore-nosuch" in result.stderr


def test_plugins_json_and_table():
    infos = json.loads(run("plugins", "--json").stdout)
    by_name = {info["name"]: info for info in infos}
    assert by_name["fsdp"]["distribution"] == "rlcore-fsdp"
    assert by_name["fsdp"]["registers"] == {"train_engines": ["fsdp"]}
    assert all({"name", "version", "distribution", "status", "registers"} <= set(i) for i in infos)
    assert "rlcore-fsdp" in run("plugins").stdout


def test_env_and_version():
    data = json.loads(run("env", "--json").stdout)
    assert data["packages"]["torch"].startswith("2.")
    assert data["device"]["platform"] in {"cpu", "cuda"}
    assert "fsdp" in data["plugins"]
    assert run("--version").stdout.startswith("rlcore ")


# -- names of registered components, checked before anything starts ------------------------------
#: One bad name per registry-backed key. Engine names are checked first (they select the plugin
#: sections), so they are one invocation and the other names another.
BAD_ENGINES = ("engine=fsdpp", "rollout.engine=hff")
BAD_NAMES = (
    "algorithm.name=grpx",
    "algorithm.adv_estimator=gaee",
    "algorithm.policy_loss=vanila",
    "reward.provider=rules",
    "transport.name=rayy",
    "trainer.device=cpuu",
)


def test_config_validate_rejects_every_unknown_component_name():
    for overrides in (BAD_ENGINES, BAD_NAMES):
        result = run("config", "--validate", *overrides)
        assert result.returncode == 2, result.stdout
        assert "Traceback" not in result.stderr
        for override in overrides:
            key, _, value = override.partition("=")
            assert f"'{key}': unknown " in result.stderr and f"{value!r}" in result.stderr
        assert "Did you mean 'grpo'?" in result.stderr or "Did you mean 'fsdp'?" in result.stderr


def test_plain_config_fails_on_an_unknown_name_like_on_an_unknown_key():
    result = run("config", "algorithm.name=grpx")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(
        "rlcore config: error: invalid config: 'algorithm.name': unknown algorithm 'grpx'."
    )
    assert "Did you mean 'grpo'?" in result.stderr


def test_config_accepts_the_default_and_explicit_good_names():
    assert run("config", "--validate").returncode == 0
    good = ("algorithm.name=ppo", "algorithm.adv_estimator=gae", "algorithm.policy_loss=gspo")
    result = run(
        "config", "--validate", "--engine", "fsdp", "--rollout", "hf", *good, "transport.name=broadcast"
    )
    assert result.returncode == 0, result.stderr


def _estimator_plugin(folder: Path) -> dict[str, str]:
    """An entry-point plugin registering the advantage estimator ``my_adv``, found through PYTHONPATH
    (a dist-info folder beside the module), as a pip-installed plugin is: nothing is installed."""
    (folder / "rlcore_test_my_adv.py").write_text(
        "from rlcore import PLUGIN_API_VERSION as RLCORE_PLUGIN_API, hookimpl\n\n\n"
        "@hookimpl\n"
        "def register_advantage_estimators(register):\n"
        "    register('my_adv', 'rlcore_test_my_adv:my_adv')\n"
    )
    dist = folder / "rlcore_test_my_adv-0.0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rlcore-test-my-adv\nVersion: 0.0.1\n")
    (dist / "entry_points.txt").write_text("[rlcore]\nmy_adv = rlcore_test_my_adv\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLCORE_")}
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")]))}


def test_a_third_party_estimator_from_an_entry_point_is_accepted(tmp_path):
    env = _estimator_plugin(tmp_path)
    assert run("config", "--validate", "algorithm.adv_estimator=my_adv", env=env).returncode == 0
    blocked = {
        **env,
        "RLCORE_BLOCK_PLUGINS": "my_adv",
    }  # the same registries the run uses: not loaded, not known
    result = run("config", "--validate", "algorithm.adv_estimator=my_adv", env=blocked)
    assert (
        result.returncode == 2
        and "'algorithm.adv_estimator': unknown advantage estimator 'my_adv'" in result.stderr
    )


@pytest.mark.parametrize(
    "override, expected",
    [
        ("algorithm.name=grpx", "'algorithm.name': unknown algorithm 'grpx'"),
        ("algorithm.adv_estimator=gae", "'algorithm': preset 'grpo': estimator 'gae' needs a critic"),
        (
            "data.train_files=[{tmp}/missing.jsonl]",
            "'data.train_files[0]': '{tmp}/missing.jsonl' does not exist",
        ),
        ("agent.tools=[calculator,nosuch]", "'agent.tools[1]': unknown tool 'nosuch'. Installed: calculator"),
    ],
)
def test_train_with_a_bad_name_or_file_exits_before_making_a_run_directory(tmp_path, override, expected):
    runs = tmp_path / "runs"
    result = run("train", f"trainer.output_dir={runs}", override.format(tmp=tmp_path))
    assert result.returncode == 2
    assert expected.format(tmp=tmp_path) in result.stderr
    assert "Traceback" not in result.stderr
    assert not runs.exists()


def test_config_validate_names_a_misspelt_tool_and_the_closest_one(tmp_path):
    result = run("config", "--validate", "agent.tools=[pythn]")
    assert result.returncode == 2
    assert "'agent.tools[0]': unknown tool 'pythn'." in result.stderr
    assert "Did you mean 'python'?" in result.stderr

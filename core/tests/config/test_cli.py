"""The `rlcore` command line, run as users run it (a subprocess of the installed console script)."""

import json
import subprocess
import sys
from pathlib import Path

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

"""Plugin discovery end to end, with real installed distributions (tests/plugin_packages/).

The three test plugins are pip-installed into the running virtual environment for the duration of this
module and uninstalled afterwards: real distributions found through their ``rlcore`` entry points,
exactly as a user's ``pip install rlcore-<name>`` would be.

- ``rlcore-test-echo`` (entry point ``echo``): registers the ``echo`` train engine.
- ``rlcore-test-boom`` (``boom``): its entry-point module raises on import.
- ``rlcore-test-future`` (``future``): declares ``RLCORE_PLUGIN_API = ">=2.0,<3"``, a newer API.

echo and boom declare ``">=1.0,<2"``; echo's requirements hold (one extra's package is absent), boom's
own ``rlcore-test-libboom>=1.0`` is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from rlcore.api import API_VERSION

PACKAGES = Path(__file__).parent / "plugin_packages"
BOOM = "RuntimeError: rlcore-test-boom is broken on purpose: libboom.so not found"
RLCORE = Path(sys.executable).with_name("rlcore")


DISTRIBUTIONS = ("rlcore-test-echo", "rlcore-test-boom", "rlcore-test-future")


def _pip(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"pip {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The three test plugins, installed into this virtual environment until the module ends."""
    work = tmp_path_factory.mktemp("plugin-src")
    sources = []
    for name in ("echo", "boom", "future"):
        # Build from a copy, so the build leaves no build/ or egg-info in the checkout.
        dst = work / name
        shutil.copytree(
            PACKAGES / name, dst, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
        )
        sources.append(str(dst))
    _pip("install", "--no-deps", "--no-build-isolation", "-q", *sources)
    try:
        yield sys.prefix
    finally:
        _pip("uninstall", "-y", "-q", *DISTRIBUTIONS)


def run(site: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """Run a command in the environment holding the test plugins, ``env`` added (``RLCORE_*`` cleared)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RLCORE_") and k != "RAY_ADDRESS"}
    return subprocess.run([*args], capture_output=True, text=True, env={**base, **env}, timeout=300)


def plugins_json(site: Path, **env: str) -> dict[str, dict]:
    proc = run(site, str(RLCORE), "plugins", "--json", **env)
    listing = json.loads(proc.stdout)
    assert isinstance(listing, list)
    # Exit 1 exactly when a plugin failed to load or its own requirements do not hold (blocked and
    # not-selected ones are not failures).
    failed = any(
        info["status"] == "failed" or (info["status"] == "loaded" and info["requirements_ok"] is False)
        for info in listing
    )
    assert proc.returncode == (1 if failed else 0), proc.stderr
    for info in listing:
        missing = {"name", "version", "distribution", "status", "error", "registers"} - set(info)
        missing |= {"api_range", "requirements", "requirements_ok"} - set(info)
        assert not missing, f"plugin entry {info.get('name')} lacks {missing}"
    return {info["name"]: info for info in listing}


def test_plugins_json_reports_each_plugin(site):
    plugins = plugins_json(site)
    echo = plugins["echo"]
    assert (echo["status"], echo["error"]) == ("loaded", None)
    assert (echo["distribution"], echo["version"]) == ("rlcore-test-echo", "0.0.1")
    assert echo["registers"] == {"train_engines": ["echo"]}

    boom = plugins["boom"]
    assert boom["status"] == "failed" and boom["registers"] == {}
    assert BOOM in boom["error"]  # the plugin's real exception, with its traceback
    assert "rlcore_test_boom/plugin.py" in boom["error"]

    future = plugins["future"]
    assert future["status"] == "failed" and future["registers"] == {} and future["api_range"] is None
    assert future["error"] == (
        "IncompatiblePlugin: plugin 'future' (rlcore-test-future 0.0.1, module rlcore_test_future.plugin) "
        f"supports rlcore plugin API >=2.0,<3, but rlcore 0.1.0 provides API {API_VERSION}, so it was not loaded. "
        "The plugin is newer than this rlcore: upgrade rlcore to one that provides an API in >=2.0,<3 "
        f"(`{sys.executable} -m pip install -U rlcore`), or install a release of rlcore-test-future that "
        f"supports API {API_VERSION}."
    )

    # the others still load: core's own engine plugins and the built-ins
    assert plugins["fsdp"]["status"] == "loaded" and plugins["fsdp"]["registers"] == {
        "train_engines": ["fsdp"]
    }
    assert plugins["rlcore.testing.plugin"]["builtin"] is True


def test_plugins_json_reports_api_range_and_requirements(site):
    plugins = plugins_json(site)
    echo = plugins["echo"]
    assert echo["api_range"] == ">=1.0,<2" and echo["requirements_ok"] is True
    reqs = {r["requirement"]: r for r in echo["requirements"]}
    assert set(reqs) == {"rlcore>=0.1", "packaging>=20", "rlcore-test-absent>=1"}
    assert reqs["rlcore>=0.1"] == {
        "requirement": "rlcore>=0.1",
        "extra": None,
        "installed": "0.1.0",
        "ok": True,
    }
    assert reqs["packaging>=20"]["ok"] and reqs["packaging>=20"]["installed"]
    # an extra's package that is absent is shown, and does not make the plugin's requirements fail
    assert reqs["rlcore-test-absent>=1"] == {
        "requirement": "rlcore-test-absent>=1",
        "extra": "fancy",
        "installed": None,
        "ok": False,
    }

    boom = plugins["boom"]
    assert boom["requirements_ok"] is False
    assert {"requirement": "rlcore-test-libboom>=1.0", "extra": None, "installed": None, "ok": False} in boom[
        "requirements"
    ]
    # the in-tree plugins declare their range, and their requirements hold in this environment
    assert plugins["fsdp"]["api_range"] == ">=1.0,<2" and plugins["fsdp"]["requirements_ok"] is True
    assert any(r["requirement"].startswith("torch") and r["ok"] for r in plugins["fsdp"]["requirements"])


def test_plugins_table_shows_the_failure(site):
    proc = run(site, str(RLCORE), "plugins", COLUMNS="200")
    assert proc.returncode == 1, proc.stderr  # a plugin failed to load
    assert "rlcore-test-echo" in proc.stdout and BOOM in proc.stdout
    lines = proc.stdout.splitlines()
    block = lines[lines.index("echo (rlcore-test-echo 0.0.1): loaded") :][:5]
    assert block[1].split() == ["train", "engines", "echo"]
    assert block[2].split() == ["api", ">=1.0,<2", "(rlcore", "provides", f"{API_VERSION})"]
    assert block[3].startswith("  requires ") and "rlcore>=0.1 (0.1.0), packaging>=20 (" in block[3]
    assert block[4].split() == ["extra", "fancy", "rlcore-test-absent>=1", "(not", "installed)"]
    start = lines.index("boom (rlcore-test-boom 0.0.1): failed, 1 requirement not met")
    boom = "\n".join(lines[start : start + 3])
    assert "rlcore-test-libboom>=1.0 (NOT MET: not installed)" in boom
    assert f"to fix                 {sys.executable} -m pip install 'rlcore-test-libboom>=1.0'" in boom
    assert "future (rlcore-test-future 0.0.1): failed" in lines
    assert "  ! IncompatiblePlugin: plugin 'future' (rlcore-test-future 0.0.1, module" in proc.stdout


def test_a_refused_plugins_engine_quotes_the_refusal(site):
    proc = run(site, str(RLCORE), "train", "--engine", "future")
    assert proc.returncode == 2, proc.stderr
    assert "unknown train engine 'future'" in proc.stderr
    assert "Plugin 'future' is installed but failed to load, which is why" in proc.stderr
    assert f"supports rlcore plugin API >=2.0,<3, but rlcore 0.1.0 provides API {API_VERSION}" in proc.stderr
    assert "Traceback (most recent call last)" not in proc.stderr


def test_plugins_exits_zero_when_every_loaded_plugin_holds(site):
    # boom and future kept out on purpose: nothing failed, every requirement of what loaded holds
    proc = run(site, str(RLCORE), "plugins", RLCORE_BLOCK_PLUGINS="boom,future")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "NOT MET" not in proc.stdout


def test_wrapped_error_lines_keep_their_marker(site):
    proc = run(site, str(RLCORE), "plugins", COLUMNS="50")
    lines = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("boom "))
    block = []
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        block.append(line)
    # the error comes last in the block, after the api/requires/to fix fields
    error = block[next(i for i, line in enumerate(block) if line.startswith("  ! ")) :]
    assert len(error) > 3 and all(line.startswith("  ! ") for line in error), "\n".join(error)
    assert "libboom.so" in "".join(line[4:] for line in error)


def test_a_blocked_plugins_engine_is_called_blocked_not_missing(site):
    proc = run(site, str(RLCORE), "train", "--engine", "echo", RLCORE_BLOCK_PLUGINS="echo")
    assert proc.returncode == 2, proc.stderr
    assert "unknown train engine 'echo'" in proc.stderr
    assert (
        "Plugin 'echo' (distribution 'rlcore-test-echo') is installed but not loaded: blocked by "
        "RLCORE_BLOCK_PLUGINS='echo'" in proc.stderr
    )
    # no install hint for echo (the only "pip install" quoted is future's refusal, listed as a failure)
    assert "pip install rlcore-echo" not in proc.stderr and "rlcore-test-echo`" not in proc.stderr


def test_block_plugins(site):
    plugins = plugins_json(site, RLCORE_BLOCK_PLUGINS="boom")
    assert plugins["boom"]["status"] == "blocked"
    assert plugins["boom"]["error"] == "blocked by RLCORE_BLOCK_PLUGINS='boom'"
    assert plugins["echo"]["status"] == "loaded" and plugins["fsdp"]["status"] == "loaded"


def test_load_only_listed_plugins(site):
    # entry-point names and distribution names both select
    plugins = plugins_json(site, RLCORE_LOAD_PLUGINS="echo,rlcore-fsdp")
    statuses = {name: info["status"] for name, info in plugins.items() if not info["builtin"]}
    assert statuses.pop("echo") == "loaded" and statuses.pop("fsdp") == "loaded"
    assert set(statuses.values()) == {"not selected"} and {"boom", "future"} <= set(statuses)

    plugins = plugins_json(site, RLCORE_LOAD_PLUGINS="")
    assert {info["status"] for info in plugins.values() if not info["builtin"]} == {"not selected"}
    assert {info["status"] for info in plugins.values() if info["builtin"]} == {"loaded"}


def test_train_with_the_failed_plugins_engine_quotes_its_error(site):
    proc = run(site, str(RLCORE), "train", "--engine", "boom")
    assert proc.returncode != 0
    assert "unknown train engine 'boom'" in proc.stderr
    assert "Plugin 'boom' is installed but failed to load, which is why" in proc.stderr
    assert BOOM in proc.stderr
    assert "pip install rlcore-boom" not in proc.stderr  # it is installed; reinstalling is not the fix
    assert "Traceback (most recent call last)" not in proc.stderr  # a user error, not an rlcore crash


def test_train_with_an_unknown_engine(site):
    proc = run(site, str(RLCORE), "train", "--engine", "nosuch")
    assert proc.returncode != 0
    first = proc.stderr.splitlines()[0]
    assert "unknown train engine 'nosuch'. Installed:" in first
    assert all(name in first for name in ("echo", "fake", "fsdp"))
    assert "pip install rlcore-nosuch" in proc.stderr


RAY_SCRIPT = textwrap.dedent(
    """
    import json
    import ray

    @ray.remote
    def resolve(build_echo):
        from rlcore.api import EngineSpec, TrainEngine
        from rlcore.plugins import get_plugin_manager, registry
        from rlcore.testing.contract import contract_batch

        names = registry("train_engines").names()
        result = {"train_engines": names, "status": {n: i.status for n, i in get_plugin_manager().plugins.items()}}
        if build_echo:
            cls = registry("train_engines").get("echo")
            config = registry("train_engines").entry("echo").options["config"](vocab_size=64)
            engine = cls(EngineSpec(model_path="", trainable=False), config)
            batch = contract_batch(2, vocab_low=3, vocab_high=64)
            result["echo_is_train_engine"] = issubclass(cls, TrainEngine)
            result["echo_log_probs_shape"] = list(engine.infer(batch)["log_probs"].shape)
        return result

    # A private local cluster (not one another process started on this host): its workers inherit
    # this process's environment, in which the test plugins are installed.
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        everything = ray.get(resolve.remote(True))
        only_echo = ray.get(
            resolve.options(runtime_env={"env_vars": {"RLCORE_LOAD_PLUGINS": "echo"}}).remote(False)
        )
    finally:
        ray.shutdown()
    print("RESULT " + json.dumps({"everything": everything, "only_echo": only_echo}))
    """
)


def test_registries_resolve_inside_ray_workers(site, tmp_path):
    pytest.importorskip("ray")
    script = tmp_path / "ray_registry.py"
    script.write_text(RAY_SCRIPT)
    proc = run(site, sys.executable, str(script))
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    everything, only_echo = result["everything"], result["only_echo"]
    assert {"fsdp", "echo", "fake"} <= set(everything["train_engines"])
    assert everything["status"]["boom"] == "failed"
    assert everything["echo_is_train_engine"] and everything["echo_log_probs_shape"] == [2, 4]
    # RLCORE_LOAD_PLUGINS from the task's runtime_env restricts that worker's plugins
    assert only_echo["train_engines"] == ["echo", "fake"]
    assert only_echo["status"]["fsdp"] == "not selected" and only_echo["status"]["echo"] == "loaded"

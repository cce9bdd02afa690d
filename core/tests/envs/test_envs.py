"""Roles' Python environments (rlcore.envs): what names an environment, whether one is ready on a node,
the interpreter a role's workers start with, and the config a run may combine them with. pip stays out
of these tests (tests/test_e2e_environments.py runs it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rlcore.cluster.ray_cluster import forwarded_env
from rlcore.config import ConfigError, load_config
from rlcore.config.schema import RLConfig
from rlcore.envs import overlay
from rlcore.envs.nodes import py_executable
from rlcore.envs.spec import HOME_ENV, EnvironmentProblem, spec_for

OLD_HF = "environments.requirements.old-hf=[transformers==5.12.1]"


def _config(**requirements: list[str]) -> RLConfig:
    config = RLConfig()
    config.environments.requirements.update(requirements)
    return config


@pytest.fixture(autouse=True)
def _no_cluster(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def test_an_environment_is_named_by_a_hash_of_its_requirements_base_and_python():
    a = spec_for(_config(x=["transformers==5.12.1", "tokenizers<0.23"]), "x")
    assert a.requirements == ("tokenizers<0.23", "transformers==5.12.1")  # sorted, pip's spelling
    assert any((Path(p) / "torch").is_dir() for p in a.base)  # the driver's package folders, torch's too
    assert a.python == f"{sys.version_info.major}.{sys.version_info.minor}"
    same = spec_for(_config(x=["tokenizers <0.23", "transformers==5.12.1"]), "x")
    other = spec_for(_config(x=["transformers==5.12.0"]), "x")
    assert same.key == a.key and other.key != a.key
    assert a.dirname == f"x-{a.key}" and len(a.key) == 12


def test_a_plugin_names_its_own_environment():
    spec = spec_for(RLConfig(), "sglang")
    assert spec.requirements == ("rlcore-sglang[cuda]",)
    assert "RLCORE_PLUGIN_ENV of plugin 'sglang'" in spec.source
    # A plugin that declares none: its own distribution at the installed version.
    fsdp = spec_for(RLConfig(), "fsdp")
    assert fsdp.requirements == ("rlcore-fsdp==0.1.0",)


def test_an_unknown_environment_and_a_bad_requirement_are_clear_errors():
    with pytest.raises(EnvironmentProblem, match=r"environment 'nope' is neither defined under environments"):
        spec_for(RLConfig(), "nope")
    with pytest.raises(EnvironmentProblem, match=r"environments.requirements.x: 'transformers===' is not"):
        spec_for(_config(x=["transformers==="]), "x")
    with pytest.raises(ConfigError, match=r"'environments.roles.rollout': environment 'nope' is neither"):
        load_config(overrides=["environments.roles.rollout=nope"])
    with pytest.raises(ConfigError, match=r"environments.roles.*has role 'actr'; roles that can run"):
        load_config(overrides=[OLD_HF, "environments.roles.actr=old-hf"])


def test_a_role_in_its_own_environment_runs_on_ray_in_processes_of_its_own():
    notes: list[str] = []
    config = load_config(overrides=[OLD_HF, "environments.roles.rollout=old-hf"], notes=notes)
    assert (config.trainer.placement, config.trainer.backend) == ("colocated", "ray")
    assert any("the rollout runs in another environment than the actor" in n for n in notes)
    with pytest.raises(ConfigError, match=r"trainer.backend local runs every role in this process"):
        load_config(overrides=[OLD_HF, "environments.roles.rollout=old-hf", "trainer.backend=local"])
    with pytest.raises(ConfigError, match=r"hybrid builds the rollout inside the actor's processes"):
        load_config(overrides=[OLD_HF, "environments.roles.rollout=old-hf", "trainer.placement=hybrid"])
    # Actor and rollout in the same environment may share processes, on Ray.
    both = load_config(
        overrides=[OLD_HF, "environments.roles.rollout=old-hf", "environments.roles.actor=old-hf"]
    )
    assert (both.trainer.placement, both.trainer.backend) == ("hybrid", "ray")


def _run_in(path: Path, code: str) -> str:
    """What ``code`` prints, run by the interpreter of the environment at ``path``."""
    python = str(path / "bin" / "python")
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout


def _fake_built(spec, home: Path, **marker) -> Path:
    """A folder as a finished build leaves it (the interpreter a link to this one)."""
    path = spec.path(home)
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "python").symlink_to(sys.executable)
    fields = {
        "key": spec.key,
        "base": spec.base,
        "python": spec.python,
        "requirements": list(spec.requirements),
    }
    (path / overlay.MARKER).write_text(json.dumps({**fields, **marker}))
    return path


def test_status_tells_ready_missing_incomplete_and_stale(tmp_path):
    spec = spec_for(_config(x=["transformers==5.12.1"]), "x")
    assert overlay.status(spec, tmp_path).state == "missing"
    newer = spec_for(_config(x=["transformers==5.13.0"]), "x")
    _fake_built(spec, tmp_path)
    assert overlay.status(spec, tmp_path).ready
    stale = overlay.status(newer, tmp_path)
    assert stale.state == "stale" and "['transformers==5.12.1'], not ['transformers==5.13.0']" in stale.detail
    (spec.path(tmp_path) / overlay.MARKER).unlink()  # a build that stopped before its marker
    assert overlay.status(spec, tmp_path).state == "incomplete"


def test_a_failed_build_leaves_nothing_that_looks_built(tmp_path):
    spec = spec_for(_config(x=["rlcore-no-such-package-anywhere==0.0.1"]), "x")
    with pytest.raises(overlay.BuildError, match=r"pip failed .*rlcore-no-such-package-anywhere"):
        overlay.build(spec, tmp_path, pip_args=["--no-index"], say=lambda line: None)
    assert not spec.path(tmp_path).exists()


def test_an_environment_without_requirements_overlays_the_drivers(tmp_path):
    """No pip: the venv and its .pth only. Its interpreter imports rlcore and torch from the driver's
    site-packages (the editable install included) and reports its own prefix."""
    spec = spec_for(_config(bare=[]), "bare")
    path = overlay.build(spec, tmp_path, say=lambda line: None)
    assert overlay.status(spec, tmp_path).ready
    out = _run_in(path, "import sys, rlcore, torch; print(sys.prefix, rlcore.__file__)").split()
    assert out[0] == str(path) and out[1].startswith(str(Path(__file__).parents[2] / "rlcore"))
    marker = overlay.read_marker(path)
    assert marker["versions"]["torch"] and marker["key"] == spec.key


def test_workers_start_with_the_environment_under_their_own_nodes_home(tmp_path):
    spec = spec_for(_config(x=["transformers==5.12.1"]), "x")
    command = py_executable(spec)
    for env, home in ((tmp_path / "a", tmp_path / "a"), (None, Path.home() / ".cache" / "rlcore" / "envs")):
        shell_env = {"HOME": str(Path.home()), "PATH": os.environ["PATH"]} | (
            {HOME_ENV: str(env)} if env else {}
        )
        # Ray runs `exec <py_executable> default_worker.py ...` through bash -c on the worker's node.
        echoed = subprocess.run(
            ["bash", "-c", f"echo {command}"], env=shell_env, capture_output=True, text=True, check=True
        ).stdout.strip()
        assert echoed == f"env -u PYTHONPATH {home / spec.dirname / 'bin' / 'python'}"


def test_the_node_local_home_is_not_forwarded_to_workers(monkeypatch):
    monkeypatch.setenv(HOME_ENV, "/driver/envs")
    monkeypatch.setenv("RLCORE_LOAD_PLUGINS", "fsdp")
    env = forwarded_env()
    assert HOME_ENV not in env and env["RLCORE_LOAD_PLUGINS"] == "fsdp"


def test_rlcore_env_list_exits_1_when_a_roles_environment_is_not_ready(tmp_path):
    env = {**os.environ, HOME_ENV: str(tmp_path)}
    rlcore = str(Path(sys.executable).with_name("rlcore"))
    args = [rlcore, "env", "list", OLD_HF, "environments.roles.rollout=old-hf"]
    done = subprocess.run(args, env=env, capture_output=True, text=True)
    assert (
        done.returncode == 1
        and "role rollout: environment old-hf is missing: never built on this node" in done.stdout
    )
    _fake_built(spec_for(_config(**{"old-hf": ["transformers==5.12.1"]}), "old-hf"), tmp_path)
    done = subprocess.run(args, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "role rollout: environment old-hf is ready" in done.stdout, done.stdout


def test_an_environment_reads_its_sites_before_the_drivers_and_needs_no_pip_when_they_meet_it(tmp_path):
    """A machine without a registry: the packages are in a folder already (``pip install --target``);
    the requirement is met there, so the build runs no pip (``--no-index`` would fail it otherwise), and
    the folder's module shadows the driver's of the same name."""
    site = tmp_path / "site"
    (site / "rlcore_probe_pkg").mkdir(parents=True)
    (site / "rlcore_probe_pkg" / "__init__.py").write_text("WHERE = 'site'\n")
    info = site / "rlcore_probe_pkg-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rlcore-probe-pkg\nVersion: 1.2\n")
    # A module named like one of the driver's: the site's comes first.
    (site / "attrs").mkdir()
    (site / "attrs" / "__init__.py").write_text("WHERE = 'site'\n")
    config = _config(probe=["rlcore-probe-pkg==1.2"])
    config.environments.sites["probe"] = [str(site)]
    spec = spec_for(config, "probe")
    assert (
        spec.sites == (str(site),)
        and spec.key != spec_for(_config(probe=["rlcore-probe-pkg==1.2"]), "probe").key
    )
    said: list[str] = []
    path = overlay.build(spec, tmp_path / "home", pip_args=["--no-index"], say=said.append)
    assert any("met by the folders it reads: nothing for pip" in line for line in said)
    out = _run_in(
        path, "import attrs, rlcore_probe_pkg, torch; print(attrs.WHERE, rlcore_probe_pkg.WHERE)"
    ).split()
    assert out == ["site", "site"]
    assert overlay.read_marker(path)["versions"]["rlcore-probe-pkg"] == "1.2"
    # On a node where the site folder is not there, the environment is not ready (the folder holds
    # __pycache__ now: removed whole).
    import shutil

    shutil.rmtree(site)
    found = overlay.status(spec, tmp_path / "home")
    assert found.state == "stale" and f"folders it reads are missing here: {site}" in found.detail


def test_a_plugins_extra_counts_what_it_asks_for():
    wanted = {str(r) for r in overlay.expanded(["rlcore-sglang[cuda]"])}
    assert "rlcore-sglang[cuda]" in wanted and any(r.startswith("sglang>=") for r in wanted)


def test_without_a_venv_module_the_environment_is_laid_out_by_hand(tmp_path, monkeypatch):
    """Some distributions split ``venv`` off their Python: the folder is then made by hand, and its
    interpreter still takes it as its prefix and reads the driver's packages."""
    real_run = overlay._run

    def no_venv(command, log, what):
        if what == "creating the venv":
            raise overlay.BuildError("No module named venv")
        return real_run(command, log, what)

    monkeypatch.setattr(overlay, "_run", no_venv)
    spec = spec_for(_config(bare=[]), "bare")
    path = overlay.build(spec, tmp_path, say=lambda line: None)
    out = _run_in(path, "import sys, rlcore; print(sys.prefix)").strip()
    assert out == str(path) and overlay.status(spec, tmp_path).ready


def test_rlcore_env_build_takes_overrides_after_its_options(tmp_path):
    env = {**os.environ, HOME_ENV: str(tmp_path)}
    rlcore = str(Path(sys.executable).with_name("rlcore"))
    args = [rlcore, "env", "build", "bare", "--no-index", "environments.requirements.bare=[]"]
    done = subprocess.run(args, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).parent == tmp_path and "bare ready in" in done.stderr
    done = subprocess.run(
        [rlcore, "env", "build", "bare", "--no-such-flag"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 2 and "unrecognized arguments: --no-such-flag" in done.stderr

"""``rlcore new-plugin``: every kind's skeleton installs and passes its own tests at once, and bad names,
unknown kinds, taken names and existing folders are refused with a message saying what to change.

Each skeleton is installed for real (a wheel built by setuptools, into a folder of its own with
``pip --target``, never into this environment, where the other tests would see its entry point) and its
tests run in a fresh process with that folder on ``PYTHONPATH``, so ``importlib.metadata`` finds the
entry point exactly as after ``pip install``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rlcore.cli.main import main
from rlcore.cli.new_plugin import KINDS, NewPluginError, check_name, new_plugin, plan, rlcore_range

#: kind -> a plugin name to generate it under (hyphens and digits included on purpose).
NAMES = {
    "train": "toy-train",
    "rollout": "toy-roll2",
    "reward": "exact-answer",
    "tool": "word-count",
    "device": "toy-dev",
    "transport": "files",
}
#: Seconds a skeleton's own test run may take (the engines' contract suites take ~30 s on 2 cores).
TEST_TIMEOUT_S = 600


def _child_env(site: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "RLCORE_LOAD_PLUGINS", "RLCORE_BLOCK_PLUGINS")
    }
    env["PYTHONPATH"] = str(site)
    # The tiny model gains nothing from threads, and on a loaded 2-core machine OpenMP's spinning threads
    # make each step 20-40x slower.
    env["OMP_NUM_THREADS"] = "1"
    return env


def test_kinds_match_the_parser():
    from rlcore.cli.main import build_parser

    sub = next(
        a for a in build_parser()._actions if getattr(a, "choices", None) and "new-plugin" in a.choices
    )
    kind = next(a for a in sub.choices["new-plugin"]._actions if "--kind" in a.option_strings)
    assert tuple(kind.choices) == tuple(KINDS) == tuple(NAMES)


@pytest.mark.parametrize(
    "kind",
    [pytest.param(k, marks=pytest.mark.slow) if k in ("train", "rollout") else k for k in NAMES],
)
def test_skeleton_installs_and_passes_its_own_tests(kind, tmp_path, capsys):
    name = NAMES[kind]
    assert main(["new-plugin", name, "--kind", kind, "--dir", str(tmp_path / "src")]) == 0
    out = capsys.readouterr().out
    folder = tmp_path / "src" / f"rlcore-{name}"
    assert f"wrote {folder}/" in out and f"pip install -e {folder}" in out
    package = f"rlcore_{name.replace('-', '_')}"
    files = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
    expected = {"pyproject.toml", "README.md", f"{package}/__init__.py", f"{package}/plugin.py"}
    expected.add(f"tests/test_{kind}.py")
    if kind in ("train", "rollout"):
        expected.add(f"{package}/config.py")
    assert expected <= files, f"missing {sorted(expected - files)}"
    for path in folder.rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert "{{" not in text and "NotImplementedError" not in text, path
    pyproject = (folder / "pyproject.toml").read_text()
    assert f'[project.entry-points.rlcore]\n{name} = "{package}.plugin"' in pyproject
    assert f'"rlcore{rlcore_range(__import__("rlcore").__version__)}"' in pyproject

    site = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["--target", str(site), str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    assert (site / package / "plugin.py").is_file()

    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=folder,
        env=_child_env(site),
        capture_output=True,
        text=True,
        timeout=TEST_TIMEOUT_S,
    )
    report = run.stdout[-6000:] + run.stderr[-3000:]
    assert run.returncode == 0, f"the {kind} skeleton's tests failed:\n{report}"
    last = run.stdout.strip().splitlines()[-1]
    assert " passed" in last and "failed" not in last and "error" not in last, last


@pytest.mark.parametrize(
    "bad", ["Toy", "my_engine", "-toy", "toy-", "my--engine", "2fast", "", "toy.engine", "x" * 41]
)
def test_bad_names_are_refused_naming_the_rule(bad, tmp_path, capsys):
    assert main(["new-plugin", "--kind", "tool", "--dir", str(tmp_path), "--", bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlcore new-plugin: error: invalid plugin name")
    assert "lowercase letters, digits" in err or "at most 40 characters" in err
    assert not any(tmp_path.iterdir()), "nothing may be written for a refused name"


def test_good_names_pass():
    for good in ("toy", "my-engine2", "a1-b2-c3", "x" * 40):
        check_name(good)


def test_existing_folder_is_refused_and_left_alone(tmp_path, capsys):
    existing = tmp_path / "rlcore-toy"
    existing.mkdir()
    (existing / "mine.txt").write_text("keep me")
    assert main(["new-plugin", "toy", "--kind", "reward", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{existing} already exists" in err and "nothing was written" in err
    assert [p.name for p in existing.iterdir()] == ["mine.txt"]
    with pytest.raises(NewPluginError, match="already exists"):
        new_plugin("toy", "reward", tmp_path)


def test_unknown_kind_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["new-plugin", "toy", "--kind", "sampler", "--dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "invalid choice: 'sampler'" in capsys.readouterr().err
    with pytest.raises(NewPluginError, match="unknown kind 'sampler'; choose one of train, rollout"):
        plan("toy", "sampler")


def test_a_name_taken_for_the_same_kind_is_refused(tmp_path, capsys):
    # A name can be registered once: the built-in cpu platform holds "cpu".
    assert main(["new-plugin", "cpu", "--kind", "device", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "a device platform named 'cpu' is already registered by plugin" in err
    assert not any(tmp_path.iterdir())
    # Another kind's registry does not hold it: a reward provider may be called "cpu".
    assert main(["new-plugin", "cpu", "--kind", "reward", "--dir", str(tmp_path)]) == 0


def test_rlcore_range():
    assert rlcore_range("0.1.0") == ">=0.1,<0.2"
    assert rlcore_range("0.12.3.dev1") == ">=0.12,<0.13"
    assert rlcore_range("1.4.2") == ">=1.4,<2"

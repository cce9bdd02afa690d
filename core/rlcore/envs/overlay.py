"""Building an overlay environment on this node, and telling whether one is ready.

The folder ``<home>/<name>-<hash>`` holds a venv (``python -m venv --without-pip``: its ``bin/python``
is the driver's base interpreter) whose ``site-packages`` has a ``.pth`` line calling
``site.addsitedir`` on the driver's ``site-packages`` (so the editable installs and ``.pth`` files there
work too) and the requirements, installed by the driver's pip (``pip --python``). pip resolves against
both, installs only what the overlay changes, and never uninstalls from the base (it leaves packages
"outside environment" alone). ``rlcore-env.json`` is written last: a folder without it is a build that
did not finish, which the next build removes and redoes.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import attrs
from packaging.requirements import Requirement

from rlcore.envs.spec import EnvSpec, env_home

#: The file that marks a finished build, with what it holds.
MARKER = "rlcore-env.json"
#: The ``.pth`` that puts the driver's ``site-packages`` after the overlay's own.
BASE_PTH = "_rlcore_base.pth"
#: The interpreter a role's workers start with, relative to the environment's folder.
PYTHON = "bin/python"


class BuildError(RuntimeError):
    """pip or the venv failed; the message has the command and the tail of its log."""


@attrs.frozen
class EnvStatus:
    """``state``: ``ready``, ``missing`` (never built here), ``incomplete`` (a build that stopped) or
    ``stale`` (built here for other requirements or another driver environment); ``detail`` says more."""

    state: str
    path: str
    detail: str = ""

    @property
    def ready(self) -> bool:
        return self.state == "ready"


def read_marker(path: Path) -> dict | None:
    try:
        return json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None


def status(spec: EnvSpec, home: Path | None = None) -> EnvStatus:
    """Whether ``spec``'s environment is ready on this node (under ``home``, default :func:`env_home`)."""
    home = home or env_home()
    path = spec.path(home)
    marker = read_marker(path)
    if marker is not None and marker.get("key") == spec.key and (path / PYTHON).exists():
        gone = [p for p in (*spec.sites, *spec.base) if not os.path.isdir(p)]
        if gone:
            return EnvStatus("stale", str(path), f"folders it reads are missing here: {', '.join(gone)}")
        return EnvStatus("ready", str(path))
    if path.exists():
        return EnvStatus("incomplete", str(path), "a build there did not finish")
    others = sorted(home.glob(f"{spec.name}-*")) if home.is_dir() else []
    for other in others:
        old = read_marker(other)
        if old is None:
            continue
        if old.get("base") != list(spec.base) or old.get("python") != spec.python:
            why = f"over {old.get('base')} (Python {old.get('python')}), not {list(spec.base)} (Python {spec.python})"
        elif old.get("sites", []) != list(spec.sites):
            why = f"with sites {old.get('sites', [])}, not {list(spec.sites)}"
        else:
            why = f"for {old.get('requirements')}, not {list(spec.requirements)}"
        return EnvStatus("stale", str(path), f"{other.name} was built {why}")
    return EnvStatus("missing", str(path), "never built on this node")


@contextlib.contextmanager
def _lock(home: Path, name: str) -> Iterator[None]:
    """One build of an environment at a time on a node (two runs starting together)."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / f".{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(command: Sequence[str], log: Path, what: str) -> None:
    with open(log, "a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        done = subprocess.run(list(command), stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-25:])
        raise BuildError(f"{what} failed (exit {done.returncode}): {' '.join(command)}\n{tail}")


def worker_env() -> dict[str, str]:
    """This process's environment as a role's worker gets it: without ``PYTHONPATH``
    (:func:`rlcore.envs.nodes.py_executable`)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def installed_versions(python: Path, names: Sequence[str]) -> dict[str, str | None]:
    """What ``python`` (an environment's interpreter) imports for each distribution in ``names``."""
    script = (
        "import importlib.metadata as m, json, sys\n"
        "def v(n):\n"
        "    try: return m.version(n)\n"
        "    except m.PackageNotFoundError: return None\n"
        "print(json.dumps({n: v(n) for n in sys.argv[1:]}))"
    )
    out = subprocess.run(
        [str(python), "-c", script, *names], capture_output=True, text=True, check=True, env=worker_env()
    )
    return json.loads(out.stdout)


def expanded(requirements: Sequence[str]) -> list[Requirement]:
    """``requirements`` with what their extras ask for (``rlcore-sglang[cuda]`` -> ``sglang>=0.5.14``
    too), read from the distributions' metadata here (the driver's, which the overlay shares)."""
    out: list[Requirement] = []
    for line in requirements:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate():
            continue
        out.append(req)
        for extra in sorted(req.extras):
            try:
                lines = importlib.metadata.requires(req.name) or []
            except importlib.metadata.PackageNotFoundError:
                continue  # not installed in the base: pip brings it and what its extras need
            for sub in map(Requirement, lines):
                if sub.marker is not None and sub.marker.evaluate({"extra": extra}):
                    out.append(Requirement(f"{sub.name}{sub.specifier}"))
    return out


def unmet(requirements: Sequence[Requirement], versions: dict[str, str | None]) -> list[str]:
    """The ``requirements`` that ``versions`` (an environment's, by distribution) do not meet."""
    problems = []
    for req in requirements:
        have = versions.get(req.name)
        if have is None or not req.specifier.contains(have, prereleases=True):
            problems.append(f"{req} (the environment has {have or 'none'})")
    return problems


def build(
    spec: EnvSpec,
    home: Path | None = None,
    *,
    pip_args: Sequence[str] = (),
    force: bool = False,
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> Path:
    """Build ``spec``'s environment under ``home`` (default :func:`env_home`) unless it is ready (or
    ``force``); return its folder. ``pip_args`` go to pip (``--no-index``, ``--find-links DIR``). Progress
    lines go to ``say``; pip's own output to ``<folder>/build.log``."""
    home = home or env_home()
    path = spec.path(home)
    with _lock(home, spec.name):
        current = status(spec, home)
        if current.ready and not force:
            say(f"rlcore env: {spec.name} is ready at {path}")
            return path
        if path.exists():
            say(f"rlcore env: removing {path} ({current.detail or 'rebuilt on request'})")
            shutil.rmtree(path)
        start = time.monotonic()
        say(f"rlcore env: building {spec.name} at {path} over {', '.join(spec.sites + spec.base)}")
        try:
            _build_into(spec, path, pip_args, say)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)  # never leave half an environment that looks built
            raise
        say(f"rlcore env: {spec.name} ready in {time.monotonic() - start:.0f} s")
        return path


def _bare_venv(path: Path) -> None:
    """What ``venv --without-pip`` makes and an interpreter needs to take ``path`` as its prefix: a
    ``pyvenv.cfg`` naming the base interpreter's folder, ``bin/python`` linked to it, and
    ``lib/pythonX.Y/site-packages``."""
    base = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    (path / "bin").mkdir(exist_ok=True)
    (path / "lib" / f"python{version}" / "site-packages").mkdir(parents=True, exist_ok=True)
    (path / "pyvenv.cfg").write_text(
        f"home = {base.parent}\ninclude-system-site-packages = false\nversion = {sys.version.split()[0]}\n"
    )
    link = path / PYTHON
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(base)


def _build_into(spec: EnvSpec, path: Path, pip_args: Sequence[str], say: Callable[[str], None]) -> None:
    path.mkdir(parents=True)
    log = path / "build.log"
    try:
        _run([sys.executable, "-m", "venv", "--without-pip", str(path)], log, "creating the venv")
    except BuildError:
        _bare_venv(path)  # a Python without a working venv module (some distributions split it off)
    python = path / PYTHON
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        env=worker_env(),
    ).stdout.strip()
    Path(site).mkdir(parents=True, exist_ok=True)
    # addsitedir, not a bare path line: the .pth files there (editable installs) are read too. One line,
    # in order: the sites, then the driver's folders, all after the overlay's own site-packages.
    # (map, not a comprehension: site exec()s the line in a function, whose names a comprehension misses)
    folders = [*spec.sites, *spec.base]
    (Path(site) / BASE_PTH).write_text(f"import site; list(map(site.addsitedir, {folders!r}))\n")
    wanted = expanded(spec.requirements)
    names = sorted({r.name for r in wanted} | {"rlcore", "torch", "transformers"})
    if unmet(wanted, installed_versions(python, names)):
        say(f"rlcore env: pip install {' '.join(spec.requirements)} (log: {log})")
        command = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-compile"]
        command += ["--disable-pip-version-check", *pip_args, *spec.requirements]
        _run(command, log, "pip")
    elif spec.requirements:
        say(f"rlcore env: {' '.join(spec.requirements)} met by the folders it reads: nothing for pip")
    versions = installed_versions(python, names)
    missing = unmet(wanted, versions)
    if missing:
        raise BuildError(
            f"after pip, environment {spec.name!r} still lacks: {'; '.join(missing)} (log: {log})"
        )
    marker = {
        "name": spec.name,
        "key": spec.key,
        "requirements": list(spec.requirements),
        "base": list(spec.base),
        "sites": list(spec.sites),
        "python": spec.python,
        "source": spec.source,
        "versions": versions,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    tmp = path / (MARKER + ".tmp")
    tmp.write_text(json.dumps(marker, indent=1))
    os.replace(tmp, path / MARKER)  # last, and whole: the folder counts as built only now

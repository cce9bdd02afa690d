"""Shared by the sandbox tests: a caller that is not root.

:class:`UnprivilegedCaller` runs the local sandbox from a process running as ``nobody`` (the path of a
trainer that is not root: the sandbox then works inside a new user namespace and keeps the caller's
uid). It has the ``run_sync``/``isolation`` surface of a sandbox; each call is a JSON line to that
process and a :class:`SandboxResult` back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import attrs
import pytest
from rlcore.sandbox import SandboxLimits, SandboxResult

CORE = Path(__file__).resolve().parents[2]
NOBODY = 65534

_DRIVER = """
import json, sys
sys.path[:0] = json.loads(sys.argv[1])
from rlcore.sandbox import SandboxLimits
from rlcore.sandbox.local import LocalSandbox
box = LocalSandbox(**json.loads(sys.argv[2]))
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    call = json.loads(line)
    limits = SandboxLimits(**call["limits"]) if call["limits"] else None
    result = box.run_sync(call["code"], stdin=call["stdin"], limits=limits)
    print(json.dumps({k: getattr(result, k) for k in ("status", "stdout", "stderr", "exit_code", "wall_s",
                      "cpu_s", "truncated", "message", "isolation")}), flush=True)
"""


def interpreter_for_others() -> str:
    """A Python of this version that another user can run (this venv's may live under /root)."""
    for candidate in (sys.executable, f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"):
        real = Path(candidate).resolve()
        if real.exists() and all(os.stat(p).st_mode & 0o001 for p in [real.parent, *real.parents]):
            return str(real)
    raise AssertionError("no Python interpreter that user 'nobody' may run: the unprivileged cases need one")


class UnprivilegedCaller:
    """A :class:`~rlcore.sandbox.local.LocalSandbox` built with ``options`` in a process running as
    ``nobody``; its calls run there."""

    config_name = "unprivileged-caller"

    def __init__(self, limits: SandboxLimits, **options):
        if os.geteuid() != 0:
            pytest.skip("starting a process as nobody needs root (CI runs as root)")
        self.limits = limits
        # rlcore and its pure-Python dependencies (attrs, pluggy) from this checkout and venv.
        paths = [str(CORE), sysconfig.get_paths()["purelib"]]
        options = {"limits": None, **options}
        options.pop("limits")
        self.proc = subprocess.Popen(
            [interpreter_for_others(), "-I", "-c", _DRIVER, json.dumps(paths), json.dumps(options)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
            cwd="/",
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        )
        assert json.loads(self.proc.stdout.readline()) == {"ready": True}

    def run_sync(self, code: str, *, stdin: str = "", limits: SandboxLimits | None = None) -> SandboxResult:
        chosen = attrs.asdict(limits or self.limits)
        self.proc.stdin.write(json.dumps({"code": code, "stdin": stdin, "limits": chosen}) + "\n")
        self.proc.stdin.flush()
        return SandboxResult(**json.loads(self.proc.stdout.readline()))

    def isolation(self) -> dict:
        return self.run_sync("pass").isolation

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="session")
def others_python() -> str:
    """:func:`interpreter_for_others` (test modules cannot import conftest under importlib mode)."""
    return interpreter_for_others()


@pytest.fixture(scope="module")
def unprivileged_caller():
    """Builds :class:`UnprivilegedCaller` objects; their processes end with the test module."""
    made: list[UnprivilegedCaller] = []

    def make(limits: SandboxLimits, **options) -> UnprivilegedCaller:
        made.append(UnprivilegedCaller(limits, **options))
        return made[-1]

    yield make
    for caller in made:
        caller.close()


#: The configurations the budget and channel cases run under: the defaults from a root caller and
#: from an unprivileged one, and each fallback (a machine where the mount namespace, or every
#: namespace, cannot be made). Without the read-only root the code's user must be able to read the
#: interpreter itself, so the fallbacks take one it can (:func:`interpreter_for_others`).
FALLBACKS = {
    "root": {},
    "unprivileged": {"caller": "nobody"},
    "root-no-mountns": {"mountns": "off", "python": "others"},
    "root-no-namespaces": {"namespaces": "off", "python": "others"},
    "unprivileged-no-namespaces": {"caller": "nobody", "namespaces": "off"},
}


@pytest.fixture(scope="module", params=sorted(FALLBACKS))
def fallback_sandbox(request, unprivileged_caller, others_python):
    """A local sandbox under ``request.param`` of :data:`FALLBACKS`, with the module's ``LIMITS``;
    its ``config_name`` names the configuration. Its scratch root must be empty when it is done."""
    from rlcore.sandbox.local import LocalSandbox

    options = dict(FALLBACKS[request.param])
    caller = options.pop("caller", "root")
    if options.get("python") == "others":
        options["python"] = others_python
    limits = request.module.LIMITS
    root = Path(tempfile.mkdtemp(prefix="rlcore-sandbox-fallback-"))
    root.chmod(0o777)
    if caller == "nobody":
        box = unprivileged_caller(limits, scratch_root=str(root), **options)
    else:
        box = LocalSandbox(limits=limits, scratch_root=str(root), **options)
    box.config_name = request.param
    yield box
    assert list(root.iterdir()) == [], "a scratch directory was left behind"
    root.rmdir()

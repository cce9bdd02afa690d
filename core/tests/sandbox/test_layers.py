"""The layers themselves: the seccomp program, the fallback where the kernel refuses namespaces (a
container runtime's default syscall profile does), ``sandbox.require`` refusing to start, and what
``rlcore env`` reports."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from rlcore.sandbox import SandboxConfig, SandboxLimits, seccomp
from rlcore.sandbox.api import LAYERS
from rlcore.sandbox.local import _CHILD_SOURCE, LocalSandbox

LIMITS = SandboxLimits(wall_s=10, cpu_s=5)


def test_the_child_knows_the_same_layers():
    """The child is a standalone program (no rlcore import), so it keeps its own copy."""
    found = re.search(r"^LAYERS = (\(.*?\))", _CHILD_SOURCE, re.S | re.M)
    assert found and ast.literal_eval(found.group(1)) == LAYERS


def test_the_filter_refuses_namespaces_and_allows_fork_and_threads():
    """Installed in a fresh interpreter: what it refuses fails with EPERM, the rest still works."""
    code = (
        "import ctypes, os, threading, json\n"
        "from rlcore.sandbox.seccomp import build_filter\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "class P(ctypes.Structure):\n    _fields_ = [('len', ctypes.c_ushort), ('filter', ctypes.c_void_p)]\n"
        "program = build_filter()\nbuf = ctypes.create_string_buffer(program, len(program))\n"
        "assert libc.prctl(38, 1, 0, 0, 0) == 0\n"
        "assert libc.prctl(22, 2, ctypes.byref(P(len(program) // 8, ctypes.addressof(buf))), 0, 0) == 0\n"
        "out = {}\n"
        "out['unshare'] = (libc.unshare(0x10000000), ctypes.get_errno())\n"
        "out['mount'] = (libc.mount(b'none', b'/mnt', b'tmpfs', 0, None), ctypes.get_errno())\n"
        "pid = os.fork()\nif pid == 0:\n    os._exit(3)\nout['fork'] = os.waitpid(pid, 0)[1] >> 8\n"
        "t = threading.Thread(target=lambda: out.setdefault('thread', 1))\nt.start()\nt.join()\n"
        "out['read'] = len(open('/etc/hostname').read()) > 0\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out == {"unshare": [-1, 1], "mount": [-1, 1], "fork": 3, "thread": 1, "read": True}
    # The control: the same calls without the filter (root may unshare a user namespace).
    plain = subprocess.run(
        [sys.executable, "-c", "import ctypes; print(ctypes.CDLL(None).unshare(0x10000000))"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert plain.stdout.strip() == "0"


def test_every_architecture_table_covers_the_deny_list():
    for machine, (_arch, numbers, _x32) in seccomp.ARCHES.items():
        missing = set(seccomp.DENIED) - set(numbers) - {"iopl", "ioperm", "inotify_init"}  # x86 only
        assert not missing, (machine, missing)
        switched = {*seccomp.SYSV, *seccomp.MEMFD, "socket", "socketpair", "clone", "clone3"}
        assert switched <= set(numbers), (machine, switched - set(numbers))
        assert len(seccomp.build_filter(machine)) % 8 == 0


_WITHOUT_NAMESPACES = """
import ctypes, json, sys
from rlcore.sandbox import SandboxConfig, SandboxLimits
from rlcore.sandbox.local import LocalSandbox
from rlcore.sandbox.seccomp import build_filter

# What a container runtime's default profile does: no unshare, no mount (our own filter refuses both;
# its switches are all set to allow: IPC, memfd and sockets stay as the container has them).
libc = ctypes.CDLL(None, use_errno=True)
class P(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
program = build_filter(sysv=True, memfd=True, unix=True, inet_tcp=True, inet_other=True)
buf = ctypes.create_string_buffer(program, len(program))
assert libc.prctl(38, 1, 0, 0, 0) == 0
assert libc.prctl(22, 2, ctypes.byref(P(len(program) // 8, ctypes.addressof(buf))), 0, 0) == 0

secret, scratch_root, python = sys.argv[1], sys.argv[2], sys.argv[3]
limits = SandboxLimits(wall_s=10, cpu_s=5)
# An interpreter the unprivileged user can read: without the read-only root, nothing else makes it so.
box = LocalSandbox(limits=limits, scratch_root=scratch_root, python=python)
read = box.run_sync(f"print(open({secret!r}).read())")
works = box.run_sync("import json, decimal, os\\nprint(decimal.Decimal(1) / 8, os.getuid())")
default = LocalSandbox(limits=limits, scratch_root=scratch_root).run_sync("import os\\nprint(os.getuid())")
as_root = LocalSandbox(limits=limits, scratch_root=scratch_root, user=None).run_sync("import os\\nprint(os.getuid())")
required = LocalSandbox(limits=limits, scratch_root=scratch_root, require=["mountns"]).run_sync("print('ran')")
config = SandboxConfig(limits=limits, require=["landlock", "mountns", "netns"], options={"scratch_root": scratch_root})
print(json.dumps({
    "layers": read.isolation["layers"], "reads": read.isolation["reads"], "uid": read.isolation["uid"],
    "read": [read.status, read.stdout], "works": [works.status, works.stdout],
    "default": [default.status, default.stdout, default.message], "as_root": [as_root.status, as_root.stdout],
    "required": [required.status, required.stdout, required.message],
    "missing": config.missing_layers(),
}))
"""


def test_without_namespaces_landlock_still_restricts_reads_and_require_refuses(tmp_path, others_python):
    secret = tmp_path / "token"
    secret.write_text("planted-secret")
    secret.chmod(0o644)
    root = Path(tempfile.mkdtemp(prefix="rlcore-sandbox-layers-"))
    root.chmod(0o755)  # the unprivileged user reaches its scratch directory through it
    try:
        done = subprocess.run(
            [sys.executable, "-c", _WITHOUT_NAMESPACES, str(secret), str(root), others_python],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert list(root.iterdir()) == []
    finally:
        root.rmdir()
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    held = {name for name, layer in out["layers"].items() if layer["held"]}
    assert {"netns", "pidns", "mountns"}.isdisjoint(held) and {"landlock", "seccomp"} <= held, out["layers"]
    assert (
        "unshare" in out["layers"]["netns"]["why"]
        and "Operation not permitted" in out["layers"]["netns"]["why"]
    )
    assert out["reads"] == ["landlock"]
    assert out["read"][0] == "error" and "planted-secret" not in out["read"][1]
    uid = 65534 if os.geteuid() == 0 else os.geteuid()
    assert out["works"] == ["ok", f"0.125 {uid}\n"] and out["uid"] == uid
    status, stdout, message = out["default"]
    if os.geteuid() == 0 and Path(others_python) != Path(sys.executable).resolve():
        # This venv's interpreter is under /root, which nobody may not enter: without the read-only
        # root the sandbox refuses to run the code as root, and says why and what to do.
        assert status == "error" and stdout == "", out["default"]
        assert "refusing to run the code as root" in message and "cannot read the interpreter" in message
        assert "sandbox.user: null" in message
    else:
        assert (status, stdout) == ("ok", f"{uid}\n"), out["default"]
    # Root without capabilities is what sandbox.user: null asks for.
    assert out["as_root"] == ["ok", f"{os.geteuid()}\n"]
    status, stdout, message = out["required"]
    assert status == "error" and stdout == "" and "'mountns'" in message and "did not hold" in message
    assert len(out["missing"]) == 2
    assert all(m.startswith("'sandbox.require': layer ") for m in out["missing"])
    assert "'mountns' does not hold" in out["missing"][0] and "'netns' does not hold" in out["missing"][1]


def test_rlcore_train_refuses_to_start_when_a_required_layer_does_not_hold():
    from rlcore.config import ConfigError, load_config
    from rlcore.trainer.preflight import check_run

    config = load_config(overrides=["sandbox.require=[mountns]", "sandbox.options.mountns=off"])
    with pytest.raises(
        ConfigError, match=r"'sandbox.require': layer 'mountns' does not hold on this machine"
    ):
        check_run(config)
    with pytest.raises(ConfigError, match=r"sandbox.require: unknown layer\(s\) \['selinux'\]"):
        load_config(overrides=["sandbox.require=[selinux]"])


def test_the_config_section_reaches_the_sandbox(monkeypatch):
    from rlcore.sandbox import SANDBOX_ENV, default_sandbox_config, export_default

    monkeypatch.setenv(SANDBOX_ENV, "")
    export_default(SandboxConfig(user=None, require=["seccomp"]))
    config = default_sandbox_config()
    assert (config.user, config.require) == (None, ["seccomp"])
    box = config.build()
    assert isinstance(box, LocalSandbox) and box.user is None and box.require == ["seccomp"]
    assert box.run_sync("import os\nprint(os.getuid())", limits=LIMITS).stdout == f"{os.geteuid()}\n"


def test_rlcore_env_reports_each_layer():
    from rlcore.cli.commands import _sandbox_layers

    report = _sandbox_layers()
    assert list(report["layers"]) == list(LAYERS)
    for name, state in report["layers"].items():
        assert state == "held" or state.startswith("missing: ") and len(state) > len("missing: "), name
    # Whatever this machine allows, every concern is held by some layer (the guard at least).
    for concern in ("network", "filesystem", "reads", "processes", "signals"):
        assert report["concerns"][concern] != ["none"], (concern, report)
    if os.geteuid() == 0:
        assert report["uid"] != 0 or report["layers"]["user"].startswith("missing")

"""Acceptance: hostile code is contained and reported, and the next call still works.

Each case runs under three configurations of the local sandbox:

- ``kernel``: the kernel's layers only (network, pid and mount namespaces with the read-only root,
  Landlock, a pids cgroup, the seccomp filter), each required, the code dropped to ``nobody`` by a
  root caller, and the in-process guard off, so a pass shows the kernel layers holding;
- ``guard``: every kernel layer off, root kept, and the audit-hook guard on (the fallback where
  namespaces, Landlock and cgroups are not permitted), so a pass shows the guard holding;
- ``unprivileged``: the sandbox is called from a process running as ``nobody`` (the path of a trainer
  that is not root): namespaces inside a new user namespace, the read-only root, Landlock,
  ``RLIMIT_NPROC`` instead of a cgroup, seccomp, no guard.

This machine (root in a container, Linux 6.18, Landlock ABI 7, cgroup v1 pids hierarchy writable,
unprivileged user namespaces allowed) has every kernel layer; a machine without one fails the
``kernel`` and ``unprivileged`` cases with the sandbox's message saying which layer is missing.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from rlcore.sandbox import SandboxLimits, cgroups
from rlcore.sandbox.local import LocalSandbox

LIMITS = SandboxLimits(wall_s=3, cpu_s=2, memory_mib=512, max_processes=8)

_KERNEL = {"namespaces": "require", "mountns": "require", "landlock": "require", "seccomp": "require"}
CONFIGS = {
    "kernel": {**_KERNEL, "cgroup": "require", "guard": False, "require": ["user"]},
    "guard": {"namespaces": "off", "mountns": "off", "landlock": "off", "cgroup": "off", "seccomp": "off",
              "guard": True, "user": None},
    "unprivileged": {**_KERNEL, "cgroup": "off", "guard": False, "require": ["user"]},
}  # fmt: skip


@pytest.fixture(params=sorted(CONFIGS))
def sandbox(request, unprivileged_caller):
    options = dict(CONFIGS[request.param])
    # Under /tmp, which the unprivileged caller may traverse (pytest's tmp_path is root's alone).
    root = Path(tempfile.mkdtemp(prefix="rlcore-sandbox-test-"))
    root.chmod(0o777 if request.param == "unprivileged" else 0o755)
    if request.param == "unprivileged":
        box = unprivileged_caller(LIMITS, scratch_root=str(root), **options)
    else:
        box = LocalSandbox(limits=LIMITS, scratch_root=str(root), **options)
    box.config_name = request.param
    yield box
    assert list(root.iterdir()) == [], "a scratch directory was left behind"
    root.rmdir()
    parent = cgroups.pids_cgroup_parent()
    if parent is not None:
        assert not list(parent.glob(f"rlcore-sandbox-{os.getpid()}-*")), "a pids cgroup was left behind"


def still_works(sandbox: LocalSandbox) -> None:
    result = sandbox.run_sync("import sys\nprint(sum(map(int, sys.stdin.read().split())))", stdin="20 22")
    assert (result.status, result.stdout) == ("ok", "42\n"), result


def test_the_layers_each_configuration_claims(sandbox):
    isolation = sandbox.isolation()
    if sandbox.config_name in ("kernel", "unprivileged"):
        assert isolation["network"] == ["netns", "landlock-tcp"]
        assert isolation["filesystem"] == ["landlock"]
        assert isolation["reads"] == ["mountns", "landlock"]
        assert isolation["privileges"] == ["user", "seccomp"] and isolation["uid"] == 65534
        expected = "cgroup-pids" if sandbox.config_name == "kernel" else "rlimit-nproc"
        assert isolation["processes"] == [expected]
        assert isolation["signals"] == ["pid-namespace", "landlock-scope"]
        assert isolation["cleanup"] == ["pid-namespace", "process-group"]
        assert isolation["private_proc"] and isolation["guard"] == []
    else:
        for kind in ("network", "filesystem", "reads", "processes", "signals"):
            assert isolation[kind] == ["guard"], (kind, isolation)
        assert isolation["privileges"] == ["none"] and isolation["uid"] == 0
        assert isolation["cleanup"] == ["process-group"]


def test_infinite_loop(sandbox):
    result = sandbox.run_sync("while True:\n    pass\n")
    assert result.status == "timeout", result
    assert result.wall_s < LIMITS.wall_s + 5
    still_works(sandbox)


def test_sleeping_forever_hits_the_wall_clock_limit(sandbox):
    result = sandbox.run_sync("import time\nprint('started', flush=True)\ntime.sleep(3600)")
    assert result.status == "timeout" and "wall-clock" in result.message
    assert result.stdout == "started\n"  # output before the kill is kept
    still_works(sandbox)


def test_fork_bomb(sandbox):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = sandbox.run_sync(bomb)
    assert result.status == "timeout", result
    still_works(sandbox)


def test_process_count_is_bounded(sandbox):
    """The bomb's children sleep, so the count of forks that succeeded is what the limit allowed."""
    code = (
        "import os, time\n"
        "made = 0\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as exc:\n"
        "        print('refused:', exc)\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    made += 1\n"
        "print('made', made)\n"
    )
    result = sandbox.run_sync(code)
    assert result.status == "ok", result
    made = int(result.stdout.split("made ")[-1])
    if sandbox.config_name == "kernel":
        # The code itself plus what it made: max_processes (the sandbox's two helpers are not counted).
        assert made == LIMITS.max_processes - 1, result.stdout
        assert "Resource temporarily unavailable" in result.stdout
    elif sandbox.config_name == "unprivileged":
        # RLIMIT_NPROC counts per user (and user namespace), so the bound is an upper one.
        assert 1 <= made <= LIMITS.max_processes - 1, result.stdout
        assert "Resource temporarily unavailable" in result.stdout
    else:
        assert made == 0 and "sandbox: starting a process (os.fork) is not allowed" in result.stdout
    still_works(sandbox)


def test_ten_gib_allocation(sandbox):
    result = sandbox.run_sync("block = bytearray(10 * 2**30)\nprint(len(block))")
    assert result.status == "memory", result
    assert result.stdout == ""
    still_works(sandbox)


def test_network_call(sandbox):
    """A server on this machine's loopback that a normal child process can reach; the sandbox cannot."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    server.settimeout(0.1)
    accepted: list[object] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            accepted.append(conn)
            conn.sendall(b"hello")
            conn.close()

    code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint(s.recv(5))"
    thread = threading.Thread(target=serve)
    thread.start()
    try:
        # The control: outside the sandbox the same code connects (so the test can fail).
        plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
        assert plain.stdout == "b'hello'\n" and len(accepted) == 1
        accepted.clear()
        result = sandbox.run_sync(code)
    finally:
        stop.set()
        thread.join()
        server.close()
    assert result.status == "error", result
    assert accepted == [] and "hello" not in result.stdout
    if sandbox.config_name == "guard":
        assert "sandbox: name resolution is not allowed" in result.stderr
    still_works(sandbox)


def test_name_resolution_and_raw_ip_connections(sandbox):
    result = sandbox.run_sync(
        "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\ns.settimeout(2)\n"
        "s.connect(('1.1.1.1', 53))\nprint('connected')"
    )
    assert result.status == "error" and "connected" not in result.stdout, result
    result = sandbox.run_sync("import socket\nprint(socket.getaddrinfo('pypi.org', 443))")
    assert result.status == "error", result
    still_works(sandbox)


def test_write_outside_the_scratch_directory(sandbox, tmp_path: Path):
    # World-writable, so file permissions alone would allow it: only the sandbox refuses.
    outside = tmp_path / "outside"
    outside.mkdir()
    outside.chmod(0o777)
    keep = outside / "keep.txt"
    keep.write_text("original")
    attempts = {
        "create": f"open({str(outside / 'new.txt')!r}, 'w').write('x')",
        "overwrite": f"open({str(keep)!r}, 'w').write('changed')",
        "append": f"open({str(keep)!r}, 'a').write('more')",
        "delete": f"import os\nos.remove({str(keep)!r})",
        "rename": f"import os\nos.rename({str(keep)!r}, 'stolen.txt')",
        "mkdir": f"import os\nos.mkdir({str(outside / 'dir')!r})",
        "symlink": f"import os\nos.symlink({str(keep)!r}, 'link')\nopen('link', 'w').write('via link')",
        "dotdot": "open('../../escaped.txt', 'w').write('x')",
    }
    for name, code in attempts.items():
        result = sandbox.run_sync(code)
        assert result.status == "error", (name, result)
        # Refused (Landlock, the guard), or not there at all or read-only (the read-only root).
        refusals = ("PermissionError", "FileNotFoundError", "Read-only file system")
        assert any(word in result.stderr for word in refusals), (name, result)
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    assert keep.read_text() == "original"
    assert not (tmp_path / "escaped.txt").exists()
    # Writing inside the scratch directory is fine, /dev/null too.
    inside = sandbox.run_sync(
        "import os\nos.makedirs('a/b')\nopen('a/b/f.txt', 'w').write('x')\nos.rename('a/b/f.txt', 'g')\n"
        "open(os.devnull, 'w').write('y')\nprint(open('g').read())"
    )
    assert (inside.status, inside.stdout) == ("ok", "x\n"), inside
    still_works(sandbox)


def test_signals_to_processes_outside_the_sandbox(sandbox):
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        result = sandbox.run_sync(f"import os\nos.kill({victim.pid}, 9)\nprint('sent')")
        assert result.status == "error" and "sent" not in result.stdout, result
        assert victim.poll() is None, "the sandboxed code killed a process outside the sandbox"
    finally:
        victim.kill()
        victim.wait()
    still_works(sandbox)


def test_leftover_processes_are_killed_when_the_call_ends(tmp_path: Path):
    """With no pid namespace and no cgroup, the process group is what ends a background child."""
    box = LocalSandbox(
        limits=LIMITS,
        scratch_root=str(tmp_path),
        namespaces="off",
        cgroup="off",
        landlock="off",
        guard=False,
        user=None,  # without the read-only root, nobody cannot run this venv's interpreter under /root
    )
    result = box.run_sync(
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "print(child.pid)\n"
    )
    assert result.status == "ok", result
    pid = int(result.stdout)
    assert _gone(pid), f"background process {pid} outlived its sandbox call"


def _gone(pid: int, timeout_s: float = 5.0) -> bool:
    import time

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_guard_refuses_the_c_helper_behind_subprocess(tmp_path: Path):
    """subprocess's C helper raises no audit event of its own; the guard replaces it."""
    code = (
        "import _posixsubprocess, os\n"
        "r, w = os.pipe()\n"
        "pid = _posixsubprocess.fork_exec([b'/bin/echo', b'escaped'], [b'/bin/echo'], True, (), None, None,\n"
        "    -1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, None, -1, None, False)\n"
        "os.waitpid(pid, 0)\n"
    )
    off = {"namespaces": "off", "landlock": "off", "cgroup": "off", "user": None}
    unguarded = LocalSandbox(limits=LIMITS, scratch_root=str(tmp_path), guard=False, **off).run_sync(code)
    assert (unguarded.status, unguarded.stdout) == ("ok", "escaped\n"), unguarded  # the control
    guarded = LocalSandbox(limits=LIMITS, scratch_root=str(tmp_path), guard=True, **off).run_sync(code)
    assert guarded.status == "error" and "escaped" not in guarded.stdout
    assert "sandbox: starting a process (_posixsubprocess.fork_exec) is not allowed" in guarded.stderr

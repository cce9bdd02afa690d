"""The adversarial corpus: what model-written code may try, run through the local sandbox at its
defaults, from a root caller (as CI runs) and from a caller running as ``nobody``.

Each case must end contained, with a clear status (and, where the code would print what it got, no
secret in the output), and the next call must still work. The secrets are planted world-readable,
so file permissions alone would hand them to any user: only the sandbox keeps them out. The threat
model these cases prove is in ``docs/security.md``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

import attrs
import pytest
from rlcore.sandbox import SandboxLimits, SandboxResult
from rlcore.sandbox.local import LocalSandbox

LIMITS = SandboxLimits(wall_s=4, cpu_s=3, memory_mib=512, max_processes=8, max_file_bytes=64 * 2**20)
SECRET = "rlcore-planted-secret-6f1d"
# Where credentials live on a training machine (under the planted home, and the real ones of root).
SECRET_FILES = (".ray/auth_token", ".netrc", ".cache/huggingface/token", ".ssh/id_ed25519", "secret.txt")


@pytest.fixture(scope="module")
def planted() -> Any:
    """A world-readable home holding credentials, and a world-writable folder beside it."""
    top = Path(tempfile.mkdtemp(prefix="rlcore-planted-"))
    home = top / "home"
    for rel in SECRET_FILES:
        path = home / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{SECRET} {rel}\n")
        path.chmod(0o644)
    for path in [top, *home.rglob("*")]:
        if path.is_dir():
            path.chmod(0o755)
    (top / "open").mkdir(mode=0o777)
    (top / "open").chmod(0o777)
    yield attrs.make_class("Planted", ["top", "home", "open"])(top, home, top / "open")
    shutil.rmtree(top)


@pytest.fixture(scope="module", params=["root-caller", "unprivileged-caller"])
def sandbox(request, unprivileged_caller):
    root = Path(tempfile.mkdtemp(prefix="rlcore-sandbox-adv-"))
    root.chmod(0o777)
    if request.param == "root-caller":
        box = LocalSandbox(limits=LIMITS, scratch_root=str(root))  # the defaults
    else:
        box = unprivileged_caller(LIMITS, scratch_root=str(root))
    box.config_name = request.param
    yield box
    assert list(root.iterdir()) == [], "a scratch directory was left behind"
    root.rmdir()


def run(sandbox, code: str, **kw) -> SandboxResult:
    """One call, then the check every case ends with: the next call works."""
    result = sandbox.run_sync(code, **kw)
    after = sandbox.run_sync("import sys\nprint(sum(map(int, sys.stdin.read().split())))", stdin="20 22")
    assert (after.status, after.stdout) == ("ok", "42\n"), ("the call after", after)
    return result


def test_the_defaults_hold_every_layer(sandbox):
    isolation = sandbox.isolation()
    missing = {k: v["why"] for k, v in isolation["layers"].items() if not v["held"]}
    # An unprivileged caller may make no cgroup here: its pid namespace's init keeps the budget.
    unprivileged = sandbox.config_name == "unprivileged-caller"
    expected_missing = {"cgroup", "cgroup-memory", "cgroup-cpu"} if unprivileged else set()
    assert set(missing) == expected_missing, missing
    assert isolation["uid"] == 65534 and isolation["reads"] == ["mountns", "landlock"]


# -- the fifteen -------------------------------------------------------------------------
def test_writes_outside_scratch(sandbox, planted):
    project = Path(__file__).resolve().parents[3]
    for target in (
        planted.open / "dropped.txt",
        project / "dropped-by-sandbox.txt",
        Path("/tmp/dropped.txt"),
    ):
        result = run(sandbox, f"open({str(target)!r}, 'w').write('x')")
        assert result.status == "error", (target, result)
        assert any(e in result.stderr for e in ("PermissionError", "FileNotFoundError", "Read-only")), result
        assert not target.exists()


def test_tcp_to_this_machines_ssh_port(sandbox):
    code = "import socket\ns = socket.create_connection(('127.0.0.1', 22), timeout=2)\nprint('connected')"
    result = run(sandbox, code)
    assert result.status == "error" and "connected" not in result.stdout, result


@pytest.mark.parametrize("target", ["os.getppid()", "1", "-1"])
def test_signalling_the_parent_or_pid_1(sandbox, target):
    code = f"import os, signal\nos.kill({target}, signal.SIGKILL)\nprint('sent')"
    result = run(sandbox, code)
    # Refused (EPERM), no such process, or (pid -1) only the code's own processes: itself.
    assert result.status in ("error", "killed"), result
    assert "sent" not in result.stdout


def test_other_processes_are_not_visible(sandbox):
    code = (
        "import os\ntry:\n    pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "except OSError as exc:\n    print('refused', exc.errno)\nelse:\n    print(len(pids))"
    )
    result = run(sandbox, code)
    assert result.status == "ok", result
    assert result.stdout.startswith("refused") or int(result.stdout) <= 3, result.stdout


def test_a_500_thread_bomb(sandbox):
    code = (
        "import threading, time\nstarted = 0\nfor _ in range(500):\n    try:\n"
        "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "    except RuntimeError:\n        break\n    started += 1\nprint('started', started)\nimport os\nos._exit(0)"
    )
    result = run(sandbox, code)
    assert result.status in ("ok", "error", "memory", "timeout"), result
    if result.status == "ok":
        assert int(result.stdout.split()[-1]) < LIMITS.max_processes, result.stdout


def test_a_200_mib_file(sandbox):
    code = "with open('big', 'wb') as f:\n    for _ in range(200):\n        f.write(b'x' * 2**20)\nprint('written')"
    result = run(sandbox, code)
    assert result.status == "error" and "File too large" in result.stderr, result


def test_10_mb_of_output_is_cut(sandbox):
    result = run(sandbox, "import sys\nsys.stdout.write('y' * 10_000_000)")
    assert result.status == "ok" and result.truncated and len(result.stdout) == LIMITS.max_output_bytes


def test_a_60_s_sleep_times_out(sandbox):
    result = run(sandbox, "import time\ntime.sleep(60)")
    assert result.status == "timeout" and result.wall_s < 60, result


def test_etc_shadow_and_roots_home(sandbox):
    for code in ("print(open('/etc/shadow').read())", "import os\nprint(os.listdir('/root'))"):
        result = run(sandbox, code)
        assert result.status == "error", (code, result)
        assert "root:" not in result.stdout and result.stdout == "", result


@pytest.mark.parametrize("rel", SECRET_FILES)
def test_reading_secrets(sandbox, planted, rel):
    """The planted copy (world-readable) and root's real one (where it exists)."""
    for path in (planted.home / rel, Path("/root") / rel):
        result = run(sandbox, f"print(open({str(path)!r}).read())")
        assert result.status == "error", (path, result)
        assert SECRET not in result.stdout + result.stderr and result.stdout == ""


@pytest.mark.parametrize(
    "call",
    [
        "libc.unshare(0x10000000)",  # CLONE_NEWUSER
        "libc.unshare(0x40000000)",  # CLONE_NEWNET
        "libc.syscall(272, 0x10000000)",  # unshare(CLONE_NEWUSER), raw (x86_64 numbering)
        "libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)",  # clone(CLONE_NEWUSER | SIGCHLD), raw
        "libc.setns(os.open('/proc/self/ns/net', os.O_RDONLY), 0)",
        "libc.ptrace(16, os.getppid(), 0, 0)",  # PTRACE_ATTACH
        "libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)",
        "libc.syscall(321, 0, 0, 0)",  # bpf
        "libc.syscall(250, 0, 0, 0, 0, 0)",  # keyctl
    ],
)
def test_kernel_attack_surface_is_refused(sandbox, call):
    if "syscall(" in call and os.uname().machine != "x86_64":
        pytest.skip("raw syscall numbers are x86_64's")
    code = f"import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nprint({call}, ctypes.get_errno())"
    result = run(sandbox, code)
    assert result.status in ("ok", "error"), result
    if result.status == "ok":
        value, err = map(int, result.stdout.split())
        assert value == -1 and err in (1, 2, 13), result.stdout  # EPERM (ENOENT/EACCES for setns's open)


# -- the extras ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path",
    [
        "/proc/self/root/etc/shadow",
        "/proc/1/root/etc/shadow",
        "/proc/self/cwd/../../../../../etc/shadow",
        "/proc/1/environ",
        "/proc/self/fd/../../1/root/etc/passwd",
    ],
)
def test_proc_tricks(sandbox, path):
    result = run(sandbox, f"print(open({path!r}).read())")
    assert result.status == "error" and result.stdout == "", (path, result)


def test_symlink_tricks(sandbox, planted):
    target = planted.home / "secret.txt"
    code = (
        f"import os\nos.symlink({str(target)!r}, 'a')\nos.symlink('/etc/shadow', 'b')\n"
        "for name in ('a', 'b'):\n    try:\n        print(open(name).read())\n"
        "    except OSError as exc:\n        print(name, 'refused', type(exc).__name__)\n"
        f"os.link({str(target)!r}, 'hard')\n"
    )
    result = run(sandbox, code)
    assert SECRET not in result.stdout and "root:" not in result.stdout
    assert result.stdout.count("refused") == 2 and result.status == "error", result  # the hard link too


def test_no_inherited_descriptors(sandbox):
    code = (
        "import os\nfds = sorted(int(f) for f in os.listdir('/proc/self/fd'))\n"
        "print([f for f in fds if f > 2 and not os.path.exists(f'/proc/self/fd/{f}')] or fds)"
    )
    result = run(sandbox, code)
    assert result.status == "ok", result
    fds = eval(result.stdout)
    assert set(fds) <= {0, 1, 2, 3}, fds  # stdin, stdout, stderr and listdir's own descriptor


def test_setuid_and_capabilities(sandbox):
    code = (
        # EPERM; EINVAL in a user namespace, where uid 0 is not even mapped.
        "import os\nfor call in (lambda: os.setuid(0), lambda: os.setgid(0), lambda: os.setgroups([0])):\n"
        "    try:\n        call()\n        print('CHANGED')\n    except OSError:\n        print('refused')\n"
        "status = open('/proc/self/status').read()\n"
        "print({l.split(':')[0]: l.split()[1] for l in status.splitlines() if l.startswith(('Cap', 'NoNewPrivs', 'Seccomp:'))})"
    )
    result = run(sandbox, code)
    assert result.status == "ok", result
    lines = result.stdout.splitlines()
    assert lines[:3] == ["refused"] * 3
    fields = eval(lines[3])
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[cap], 16) == 0, fields
    assert fields["NoNewPrivs"] == "1" and fields["Seccomp"] == "2", fields


def test_prctl(sandbox):
    code = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.prctl(38, 0, 0, 0, 0), ctypes.get_errno())\n"  # clear no_new_privs: not possible
        "print(libc.prctl(23, 21, 0, 0, 0))\n"  # PR_CAPBSET_READ CAP_SYS_ADMIN: dropped
        "print(libc.prctl(35, 1, 0, 0, 0), ctypes.get_errno())\n"  # PR_SET_MM: needs CAP_SYS_RESOURCE
        "print(libc.prctl(47, 2, 21, 0, 0), ctypes.get_errno())\n"  # PR_CAP_AMBIENT_RAISE CAP_SYS_ADMIN
    )
    result = run(sandbox, code)
    assert result.status == "ok", result
    out = [line.split() for line in result.stdout.splitlines()]
    assert out[0] == ["-1", "22"] and out[1] == ["0"], out  # EINVAL; not in the bounding set
    assert out[2][0] == "-1" and out[3][0] == "-1", out


def test_writing_into_the_interpreters_files(sandbox):
    targets = [os.__file__, asyncio.__file__, sys.executable, os.path.realpath(sys.executable)]
    before = {t: hashlib.sha256(Path(t).read_bytes()).hexdigest() for t in targets}
    for target in targets:
        for code in (f"open({target!r}, 'a').write('# owned')", f"import os\nos.chmod({target!r}, 0o777)"):
            result = run(sandbox, code)
            assert result.status == "error", (target, result)
    after = {t: hashlib.sha256(Path(t).read_bytes()).hexdigest() for t in targets}
    assert after == before


def test_huge_argv_env_and_program(sandbox):
    code = (
        "import os, sys, subprocess\n"
        "try:\n    subprocess.run([sys.executable, '-c', 'pass'] + ['x' * 100_000] * 40)\n"
        "except OSError as exc:\n    print('argv', exc.errno)\n"
        "try:\n    subprocess.run([sys.executable, '-c', 'pass'], env={'A': 'y' * 4_000_000})\n"
        "except OSError as exc:\n    print('env', exc.errno)\n"
    )
    result = run(sandbox, code)
    assert result.status == "ok" and result.stdout.split() == ["argv", "7", "env", "7"], result  # E2BIG
    huge = f"# {'x' * 6_000_000}\nprint(1)\n"  # 6 MB of program
    assert run(sandbox, huge).stdout == "1\n"
    assert run(
        sandbox, "import sys\nprint(len(sys.argv), len(sys.stdin.read()))", stdin="z" * 5_000_000
    ).stdout == ("1 5000000\n")


def test_calculator_refuses_to_evaluate_import():
    """A tool call asking the calculator for ``__import__``: nothing is evaluated, the model reads an
    error, and the next call works."""
    from rlcore.agents.builtin_tools import Calculator
    from rlcore.agents.tool_calls import ToolCall
    from rlcore.agents.tools import call_tool

    tools = {"calculator": Calculator()}
    marker = Path(tempfile.gettempdir()) / f"rlcore-calculator-{os.getpid()}"
    for expression in (
        f"__import__('os').system('touch {marker}')",
        "().__class__.__base__.__subclasses__()",
        "(lambda: 1)()",
        "9 ** 9 ** 9",
    ):
        result = asyncio.run(call_tool(tools, ToolCall("calculator", {"expression": expression})))
        assert result.status == "error" and result.text.startswith("Error:"), (expression, result)
    assert not marker.exists()
    assert asyncio.run(call_tool(tools, ToolCall("calculator", {"expression": "20 + 22"}))).text == "42"


def test_loopback_server_of_the_caller_is_unreachable(sandbox):
    """A control for the network cases: the same connection from this process succeeds."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # the control
        result = run(sandbox, f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)")
    finally:
        server.close()
    assert result.status == "error", result

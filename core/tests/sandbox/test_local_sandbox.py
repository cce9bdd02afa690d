"""The local sandbox's plumbing: output, stdin, exit codes, limits on output, the scratch directory, the
environment, concurrency, and cleanup when the caller gives up (the reward worker's timer)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from rlcore.sandbox import SandboxConfig, SandboxError, SandboxLimits, SandboxResult, get_sandbox
from rlcore.sandbox.local import LocalSandbox

FAST = SandboxLimits(wall_s=10, cpu_s=5)


@pytest.fixture
def scratch_root(tmp_path: Path) -> Path:
    root = tmp_path / "sandboxes"
    root.mkdir()
    return root


@pytest.fixture
def sandbox(scratch_root: Path) -> LocalSandbox:
    return LocalSandbox(limits=FAST, scratch_root=str(scratch_root))


def test_stdout_stderr_and_exit_code_are_captured(sandbox):
    result = sandbox.run_sync("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)")
    assert (result.status, result.exit_code) == ("error", 3)
    assert result.stdout == "out\n"
    assert result.stderr == "err\n"
    assert not result.ok and "exit code 3" in result.message


def test_stdin_reaches_the_code(sandbox):
    result = sandbox.run_sync(
        "import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))", stdin="1 2\n39"
    )
    assert result.status == "ok" and result.stdout == "42\n"


def test_large_stdin_that_the_code_does_not_read(sandbox):
    # More than a pipe buffer: the feeder must not block the call, nor fail when the code exits.
    result = sandbox.run_sync("print('done')", stdin="x" * (1 << 20))
    assert result.status == "ok" and result.stdout == "done\n"


def test_an_exception_gives_error_with_a_traceback_from_main_py(sandbox):
    result = sandbox.run_sync("def f():\n    raise ValueError('bad input')\nf()\n")
    assert result.status == "error" and result.exit_code == 1
    assert result.stderr.rstrip().endswith("ValueError: bad input")
    assert 'main.py", line 3' in result.stderr
    assert "_child" not in result.stderr and "<string>" not in result.stderr  # no sandbox frames


def test_syntax_error_is_an_error_result(sandbox):
    result = sandbox.run_sync("def broken(:\n")
    assert result.status == "error" and "SyntaxError" in result.stderr


def test_exit_with_a_message_and_unicode_output(sandbox):
    result = sandbox.run_sync("import sys\nprint('π ≈ 3.14')\nsys.exit('no luck')")
    assert result.stdout == "π ≈ 3.14\n"
    assert (result.status, result.exit_code, result.stderr) == ("error", 1, "no luck\n")


def test_output_is_truncated_to_the_limit(sandbox):
    limits = SandboxLimits(wall_s=10, max_output_bytes=1000)
    result = sandbox.run_sync(
        "import sys\nprint('a' * 100_000)\nprint('b' * 5000, file=sys.stderr)", limits=limits
    )
    assert result.status == "ok" and result.truncated
    assert result.stdout == "a" * 1000 and result.stderr == "b" * 1000
    assert not sandbox.run_sync("print('short')", limits=limits).truncated


def test_code_runs_in_a_scratch_directory_with_a_minimal_environment(sandbox, scratch_root, monkeypatch):
    monkeypatch.setenv("RLCORE_SECRET_TOKEN", "do-not-leak")
    code = (
        "import os, tempfile, json\n"
        "open('made_here.txt', 'w').write('x')\n"
        "print(json.dumps({'cwd': os.getcwd(), 'env': dict(os.environ), 'tmp': tempfile.gettempdir(),\n"
        "                  'files': sorted(os.listdir('.'))}))\n"
    )
    import json

    result = sandbox.run_sync(code)
    assert result.status == "ok", result
    seen = json.loads(result.stdout)
    cwd = seen["cwd"]
    assert Path(cwd).parent.parent == scratch_root
    assert seen["env"]["HOME"] == cwd and seen["env"]["TMPDIR"] == cwd and seen["tmp"] == cwd
    assert "RLCORE_SECRET_TOKEN" not in seen["env"]
    assert set(seen["env"]) <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "OMP_NUM_THREADS",
                                "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}  # fmt: skip
    assert seen["files"] == ["made_here.txt", "main.py"]
    # ... and the scratch directory is gone afterwards, with what the code wrote in it.
    assert not Path(cwd).exists() and list(scratch_root.iterdir()) == []


def test_scratch_is_removed_even_when_the_code_locks_it(sandbox, scratch_root):
    code = (
        "import os\nos.makedirs('a/b')\nopen('a/b/f', 'w').write('x')\nos.chmod('a/b', 0)\nos.chmod('a', 0)\n"
    )
    assert sandbox.run_sync(code).status == "ok"
    assert list(scratch_root.iterdir()) == []


def test_only_the_standard_library_unless_site_packages(scratch_root):
    code = "import attrs\nprint('imported')"
    plain = LocalSandbox(limits=FAST, scratch_root=str(scratch_root)).run_sync(code)
    assert plain.status == "error" and "ModuleNotFoundError" in plain.stderr
    with_site = LocalSandbox(limits=FAST, scratch_root=str(scratch_root), site_packages=True).run_sync(code)
    assert with_site.status == "ok" and with_site.stdout == "imported\n"


def test_eight_calls_run_at_once(scratch_root):
    sandbox = LocalSandbox(limits=FAST, scratch_root=str(scratch_root), max_concurrency=8)

    async def main() -> list[SandboxResult]:
        code = "import time, sys\ntime.sleep(1.5)\nprint(int(sys.stdin.read()) ** 2)"
        return await asyncio.gather(*(sandbox.run(code, stdin=str(i)) for i in range(8)))

    start = time.monotonic()
    results = asyncio.run(main())
    elapsed = time.monotonic() - start
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(8)]
    # One after another they need 12 s of sleeping; together about 1.5 s plus start-up on a busy box.
    assert elapsed < 7.0, elapsed
    assert list(scratch_root.iterdir()) == []


def test_max_concurrency_bounds_calls_in_flight(scratch_root):
    sandbox = LocalSandbox(limits=FAST, scratch_root=str(scratch_root), max_concurrency=2)
    in_flight: list[int] = []

    async def main() -> None:
        async def watch() -> None:
            while True:
                in_flight.append(len(list(scratch_root.iterdir())))
                await asyncio.sleep(0.02)

        watcher = asyncio.create_task(watch())
        await asyncio.gather(*(sandbox.run("import time; time.sleep(0.5)") for _ in range(5)))
        watcher.cancel()

    asyncio.run(main())
    assert max(in_flight) == 2


def test_run_sync_inside_a_running_event_loop(sandbox):
    async def main() -> SandboxResult:
        return sandbox.run_sync("print(7 * 6)")  # a synchronous helper called from async code

    assert asyncio.run(main()).stdout == "42\n"


class _Interrupt(BaseException):
    pass


def test_an_interrupted_run_sync_kills_the_child_and_removes_its_scratch(sandbox, scratch_root):
    """The reward worker's per-sample timer raises into the scorer: the sandbox must not leak."""

    def on_alarm(signum, frame):
        raise _Interrupt

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    start = time.monotonic()
    try:
        with pytest.raises(_Interrupt):
            sandbox.run_sync("import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - start < 10
    assert list(scratch_root.iterdir()) == []
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cwd_under(p, scratch_root)]


def _cwd_under(proc: Path, root: Path) -> bool:
    try:
        return os.readlink(proc / "cwd").startswith(str(root))
    except OSError:
        return False


def test_result_describe_for_tool_messages():
    ok = SandboxResult(status="ok", stdout="4\n")
    assert ok.describe() == "4"
    bad = SandboxResult(status="timeout", stdout="partial\n", message="killed after 2 s")
    assert bad.describe() == "partial\n[timeout: killed after 2 s]"


def test_get_sandbox_and_config(scratch_root):
    sandbox = get_sandbox("local", limits=FAST, scratch_root=str(scratch_root), guard=False)
    assert isinstance(sandbox, LocalSandbox) and sandbox.limits == FAST and not sandbox.guard
    built = SandboxConfig(limits=SandboxLimits(wall_s=3), options={"scratch_root": str(scratch_root)}).build()
    assert isinstance(built, LocalSandbox) and built.limits.wall_s == 3
    with pytest.raises(SandboxError, match="unknown sandbox 'docker'.*Installed: http, local"):
        get_sandbox("docker")
    with pytest.raises(SandboxError, match="does not take these options.*sandbox.options"):
        get_sandbox("local", nonsense=1)
    with pytest.raises(ValueError, match="namespaces='maybe'.*auto, require, off"):
        LocalSandbox(namespaces="maybe")
    with pytest.raises(ValueError, match="user='no-such-user-here': no such user"):
        LocalSandbox(user="no-such-user-here")
    with pytest.raises(ValueError, match="sandbox.limits.wall_s must be > 0"):
        SandboxLimits(wall_s=0)


def test_a_crash_in_native_code_is_killed(sandbox):
    result = sandbox.run_sync("import ctypes\nctypes.string_at(0)")  # reads address 0: SIGSEGV
    assert (result.status, result.exit_code) == ("killed", -11), result
    assert result.message == "killed by SIGSEGV"


def test_endless_output_is_cut_and_timed_out(sandbox):
    limits = SandboxLimits(wall_s=2, max_output_bytes=4096)
    result = sandbox.run_sync("while True:\n    print('x' * 1000)", limits=limits)
    assert result.status == "timeout" and result.truncated
    assert len(result.stdout) == 4096 and set(result.stdout) <= {"x", "\n"}


def test_a_missing_required_layer_is_an_error_naming_it():
    """The result the parent builds from the child's report (a layer asked for with ``require`` that
    the kernel refused): the child writes ``fatal`` and exits before any user code runs."""
    from rlcore.sandbox.local import _result

    report = {
        "outer": {"cgroup": False},
        "fatal": "unshare(net, pid, mount, user) failed: Operation not permitted",
    }
    result = _result(
        report, "", "", timed_out=False, returncode=125, limits=FAST, truncated=False, wall_s=0.1
    )
    assert result.status == "error" and result.message.startswith("unshare(net, pid, mount, user) failed")
    assert result.isolation["network"] == ["none"] and result.isolation["processes"] == ["none"]


def test_text_a_model_may_write(sandbox):
    """Lone surrogates (from a bad decode) and NUL bytes: results, not exceptions."""
    surrogate = sandbox.run_sync("print('a\udcffb')", stdin="\ud800")
    assert surrogate.status == "ok" and surrogate.stdout == "a?b\n"
    nul = sandbox.run_sync("print(1)\x00")
    assert nul.status == "error" and "null bytes" in nul.stderr


def test_trouble_on_this_machine_is_an_error_result(tmp_path):
    missing = LocalSandbox(scratch_root=str(tmp_path / "does-not-exist")).run_sync("print(1)")
    assert missing.status == "error" and "could not run the code" in missing.message
    assert "No such file or directory" in missing.message

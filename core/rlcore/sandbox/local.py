"""The ``local`` sandbox: each call runs in a fresh, limited Python process on this machine.

Per call: a scratch directory (the code's cwd, ``HOME`` and ``TMPDIR``; removed afterwards), a new
session, a minimal environment, a pids, memory and CPU-accounting cgroup where they can be made (one
budget for all the call's processes, :mod:`rlcore.sandbox.cgroups`), and the child side
(:mod:`rlcore.sandbox._child`) that applies namespaces (network, pid, mount, IPC, cgroup), a minimal
read-only root with a size-limited scratch tmpfs, Landlock, an unprivileged user, rlimits, a seccomp
filter and the audit-hook guard before the code runs. While the call runs this side polls the
cgroup's CPU time and OOM kills (and, where scratch is on this machine's disk, its size); the wall-clock
limit, or a budget passed, kills the whole process group, the pid namespace and the cgroup. Which layers
held is in every result's ``isolation`` (``docs/security.md`` says what each one guarantees).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

from rlcore.sandbox import cgroups, seccomp
from rlcore.sandbox.api import LAYERS, Sandbox, SandboxLimits, SandboxResult

MODES = ("auto", "require", "off")
#: The user the code runs as when the caller is root, unless told otherwise.
DEFAULT_USER = "nobody"
_SECCOMP_FILTER, _SECCOMP_SLOTS, _SECCOMP_WHY = seccomp.filter_hex()
_PIVOT_ROOT = seccomp.ARCHES.get(os.uname().machine, (0, {}, False))[1].get("pivot_root")
_CHILD_SOURCE = (Path(__file__).parent / "_child.py").read_text()
_READ_CHUNK = 64 * 1024
#: Seconds between the caller's walks of a scratch directory on the machine's disk (no tmpfs).
_SCRATCH_WALK_S = 0.2


def _mode(name: str, value: Any) -> str:
    """``None``/``True``/``False`` or a mode string -> ``auto``/``require``/``off``."""
    mode = {None: "auto", True: "require", False: "off"}.get(value, value)
    if mode not in MODES:
        raise ValueError(
            f"LocalSandbox {name}={value!r}: use one of {', '.join(MODES)} (or None/True/False for "
            "auto/require/off)"
        )
    return mode


class LocalSandbox(Sandbox):
    """Runs each call in a child interpreter under ``limits``.

    ``namespaces``, ``mountns``, ``landlock``, ``cgroup`` and ``seccomp`` are each ``"auto"`` (use
    when the kernel allows it), ``"require"`` (a call fails with status ``error`` when it does not;
    for ``cgroup``: the pids, memory and CPU cgroups all) or ``"off"``; ``require`` lists layers of :data:`LAYERS` that must hold, the same way. ``guard``
    installs an audit hook in the child that refuses what no kernel layer covers (see
    :mod:`rlcore.sandbox._child`). ``python`` is the interpreter (default: this one); ``site_packages``
    lets the code import its installed packages (numpy, sympy ...), otherwise only the standard
    library. ``max_concurrency`` bounds the calls running at once per event loop (default: twice the
    CPU count).

    Reads: the code may read its scratch directory, the interpreter it runs on (and its site-packages
    with ``site_packages``), the system's shared libraries, a few devices and its own ``/proc`` entry,
    plus ``read_paths``; ``reads=False`` lifts this (the layer set before reads were restricted).

    ``user`` (a name or a uid, default ``nobody``; ``None`` keeps root) is the user the code runs as
    when the caller is root: the child drops to it before the code starts; where that user cannot read
    ``python`` (no read-only root makes it readable) the call is refused rather than run as root. A
    caller that is not root is unprivileged already and keeps its uid. Either way the code has no
    capabilities.
    """

    name = "local"

    def __init__(
        self,
        *,
        limits: SandboxLimits | None = None,
        namespaces: str | bool | None = "auto",
        landlock: str | bool | None = "auto",
        cgroup: str | bool | None = "auto",
        mountns: str | bool | None = "auto",
        seccomp: str | bool | None = "auto",
        guard: bool = True,
        python: str | None = None,
        site_packages: bool = False,
        max_concurrency: int | None = None,
        scratch_root: str | None = None,
        user: str | int | None = DEFAULT_USER,
        reads: bool = True,
        read_paths: list[str] | tuple[str, ...] = (),
        require: list[str] | tuple[str, ...] = (),
    ):
        super().__init__(limits=limits)
        self.namespaces = _mode("namespaces", namespaces)
        self.landlock = _mode("landlock", landlock)
        self.cgroup = _mode("cgroup", cgroup)
        self.mountns = _mode("mountns", mountns)
        self.seccomp = _mode("seccomp", seccomp)
        unknown = sorted(set(require) - set(LAYERS))
        if unknown:
            raise ValueError(
                f"LocalSandbox require={list(require)!r}: unknown layer(s) {unknown}; use {', '.join(LAYERS)}"
            )
        self.require = list(require)
        self.reads = bool(reads)
        self.read_paths = [os.path.abspath(p) for p in read_paths]
        self.guard = bool(guard)
        self.python = python or sys.executable
        self.site_packages = bool(site_packages)
        self.max_concurrency = max_concurrency or 2 * (os.cpu_count() or 1)
        self.scratch_root = scratch_root
        # None where the code keeps the caller's uid (not root, or told to stay root).
        self.user = _user_ids(user) if user is not None else None
        self._semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return (
            f"LocalSandbox(namespaces={self.namespaces!r}, mountns={self.mountns!r}, "
            f"landlock={self.landlock!r}, cgroup={self.cgroup!r}, seccomp={self.seccomp!r}, "
            f"user={self.user!r}, reads={self.reads}, guard={self.guard}, limits={self.limits})"
        )

    def isolation(self) -> dict[str, Any]:
        """The layers a call gets on this machine (runs one trivial call to find out)."""
        return self.run_sync("pass").isolation

    async def run(self, code: str, *, stdin: str = "", limits: SandboxLimits | None = None) -> SandboxResult:
        loop = asyncio.get_running_loop()
        semaphore = self._semaphores.get(loop)
        if semaphore is None:
            semaphore = self._semaphores[loop] = asyncio.Semaphore(self.max_concurrency)
        async with semaphore:
            try:
                return await self._run(code, stdin, limits or self.limits)
            except OSError as exc:  # this machine's trouble (no disk space, no file descriptors ...)
                return SandboxResult(
                    status="error", message=f"the local sandbox could not run the code: {exc}"
                )

    # -- one call --------------------------------------------------------------------------------
    async def _run(self, code: str, stdin: str, limits: SandboxLimits) -> SandboxResult:
        start = time.monotonic()
        workdir = Path(tempfile.mkdtemp(prefix="rlcore-sandbox-", dir=self.scratch_root))
        scratch = workdir / "scratch"
        scratch.mkdir(mode=0o700)
        # Text from a model may hold lone surrogates: they become "?" rather than an exception.
        (scratch / "main.py").write_text(code, encoding="utf-8", errors="replace")
        (workdir / "root").mkdir()  # where the child mounts the read-only root it pivots into
        if self.user is not None:
            for path in (scratch, scratch / "main.py"):
                os.chown(path, *self.user)
            # Where no read-only root is built, the user reaches scratch through this directory.
            workdir.chmod(0o711)
        if self.cgroup != "off":
            group, cgroup_why = cgroups.create(limits.max_processes, limits.memory_mib)
        else:
            group, cgroup_why = None, {c: "cgroup is off" for c in cgroups.CONTROLLERS}
        if cgroup_why and self.cgroup == "require":
            if group is not None:
                await asyncio.to_thread(cgroups.remove, group)
            _rmtree(workdir)
            return SandboxResult(
                status="error",
                message=f"cgroup='require' but {'; '.join(cgroup_why.values())}",
                wall_s=time.monotonic() - start,
            )
        watch = _Watch(group, limits, scratch)
        report_r, report_w = os.pipe()
        proc: asyncio.subprocess.Process | None = None
        readers: list[asyncio.Task] = []
        ended = "exited"
        try:
            config = {
                "scratch": str(scratch),
                "report_fd": report_w,
                "limits": {
                    "cpu_s": limits.cpu_s,
                    "memory_mib": limits.memory_mib,
                    "max_processes": limits.max_processes,
                    "max_file_bytes": limits.max_file_bytes,
                    "max_open_files": limits.max_open_files,
                    "max_scratch_bytes": limits.max_scratch_bytes,
                    "max_scratch_files": limits.max_scratch_files,
                },
                "scratch_owner": list(self.user or (os.geteuid(), os.getegid())),
                "namespaces": self.namespaces,
                "mountns": self.mountns,
                "root_dir": str(workdir / "root"),
                "pivot_root_nr": _PIVOT_ROOT,
                "landlock": self.landlock,
                "reads": self.reads,
                "read_paths": self.read_paths,
                "cgroups": group.procs_dirs if group else [],
                "cgroup_held": {c: group is not None and c in group.dirs for c in cgroups.CONTROLLERS},
                "cgroup_mode": self.cgroup,
                "cgroup_why": cgroup_why,
                "seccomp": self.seccomp,
                "seccomp_filter": _SECCOMP_FILTER,
                "seccomp_slots": _SECCOMP_SLOTS,
                "seccomp_why": _SECCOMP_WHY,
                "user": list(self.user) if self.user else None,
                "user_mode": "require" if "user" in self.require else "auto",
                "require": self.require,
                "guard": self.guard,
            }
            # -I: no user site, no PYTHON* variables, no cwd on sys.path; -S: no site-packages at all.
            flags = ["-I", "-B", "-X", "utf8"] + ([] if self.site_packages else ["-S"])
            try:
                proc = await asyncio.create_subprocess_exec(
                    self.python,
                    *flags,
                    "-c",
                    _CHILD_SOURCE,
                    json.dumps(config),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    cwd=scratch,
                    env=_environment(scratch),
                    start_new_session=True,
                    pass_fds=(report_w,),
                )
            except OSError as exc:
                return SandboxResult(
                    status="error",
                    message=f"could not start {self.python}: {exc}",
                    wall_s=time.monotonic() - start,
                )
            finally:
                os.close(report_w)
            cap = limits.max_output_bytes
            readers = [
                asyncio.create_task(_read_capped(proc.stdout, cap)),
                asyncio.create_task(_read_capped(proc.stderr, cap)),
            ]
            feeder = asyncio.create_task(_feed(proc.stdin, stdin.encode("utf-8", "replace")))
            ended = await _exited(proc, limits.wall_s, watch)
            feeder.cancel()
            _kill_group(proc.pid)
            if group is not None:
                await asyncio.to_thread(cgroups.kill_all, group)
            # Every writer of the pipes is dead now, unless code outside every layer left the session:
            # then stop reading rather than wait for it.
            done, _ = await asyncio.wait(readers, timeout=2.0)
            outputs = [t.result() if t in done else (b"", False) for t in readers]
            if len(done) < len(readers):
                proc._transport.close()  # type: ignore[attr-defined]  # else wait() waits for the pipes
            await proc.wait()
            report = _read_report(report_r)
            if "scratch" not in report:  # no tmpfs: the scratch directory is on this machine's disk
                await asyncio.to_thread(watch.check_scratch)
            watch.check_group()
        finally:
            if proc is not None and proc.returncode is None:
                _kill_group(proc.pid)
            for task in readers:
                task.cancel()
            os.close(report_r)
            if group is not None:
                await asyncio.to_thread(cgroups.remove, group)
            _rmtree(workdir)
        (stdout, out_cut), (stderr, err_cut) = outputs
        return _result(
            report,
            stdout.decode("utf-8", "replace"),
            stderr.decode("utf-8", "replace"),
            timed_out=ended == "wall",
            watch=watch,
            returncode=proc.returncode,
            limits=limits,
            truncated=out_cut or err_cut,
            wall_s=time.monotonic() - start,
        )


class _Watch:
    """The call's budget as the caller keeps it: the cgroup's CPU and OOM accounting (polled while
    the call runs, read once more after it) and, where scratch is on this machine's disk (no tmpfs
    held), the scratch directory's bytes and files. ``exceeded`` is the first limit found passed:
    ``{"limit": key of SandboxLimits, "used": amount}``."""

    def __init__(self, group: cgroups.CallGroup | None, limits: SandboxLimits, scratch: Path):
        self.group, self.limits, self.scratch = group, limits, scratch
        self.exceeded: dict[str, Any] | None = None
        self.cpu_s: float | None = None
        self._next_walk = time.monotonic() + _SCRATCH_WALK_S

    def check_group(self) -> bool:
        if self.group is None or self.exceeded:
            return bool(self.exceeded)
        if "memory" in self.group.dirs and self.group.oom_kills() > 0:
            self.exceeded = {"limit": "memory_mib", "used": self.group.memory_peak()}
        elif "cpu" in self.group.dirs:
            self.cpu_s = self.group.cpu_s()
            if self.cpu_s is not None and self.cpu_s > self.limits.cpu_s:
                self.exceeded = {"limit": "cpu_s", "used": self.cpu_s}
        return bool(self.exceeded)

    def check_scratch(self) -> bool:
        if self.exceeded:
            return True
        used, files = _disk_use(self.scratch)
        if used > self.limits.max_scratch_bytes:
            self.exceeded = {"limit": "max_scratch_bytes", "used": used}
        elif files > self.limits.max_scratch_files:
            self.exceeded = {"limit": "max_scratch_files", "used": files}
        return bool(self.exceeded)

    async def check(self) -> bool:
        """Whether the call is past its budget (a scratch walk at most every ``_SCRATCH_WALK_S``)."""
        if self.check_group():
            return True
        if time.monotonic() >= self._next_walk:
            # One listing is cheap: a walk only once the code wrote anything beside main.py.
            if _has_more_than_main(self.scratch) and await asyncio.to_thread(self.check_scratch):
                return True
            self._next_walk = time.monotonic() + _SCRATCH_WALK_S
        return False


def _has_more_than_main(scratch: Path) -> bool:
    try:
        with os.scandir(scratch) as entries:
            return any(entry.name != "main.py" for entry in entries)
    except OSError:
        return False


def _disk_use(top: Path) -> tuple[int, int]:
    """(bytes allocated, entries) beneath ``top``, not following links; what cannot be read is left
    out."""
    used = files = 0
    stack = [str(top)]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    used += st.st_blocks * 512
                    files += 1
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)
        except OSError:
            continue
    return used, files


def _user_ids(user: str | int) -> tuple[int, int] | None:
    """``(uid, gid)`` of ``user`` (a name, a uid, or a uid's digits), or ``None`` when this process is
    not root (it cannot change users, and is unprivileged already)."""
    import pwd

    if isinstance(user, str) and user.isdigit():
        user = int(user)
    try:
        entry = pwd.getpwuid(user) if isinstance(user, int) else pwd.getpwnam(user)
        ids = entry.pw_uid, entry.pw_gid
    except KeyError:
        if isinstance(user, int):
            ids = user, user  # a uid without a passwd entry (a minimal container) is fine
        elif user == DEFAULT_USER:
            ids = 65534, 65534  # the kernel's overflow uid: what nobody is everywhere
        else:
            raise ValueError(f"LocalSandbox user={user!r}: no such user on this machine") from None
    if ids[0] == 0:
        raise ValueError(f"LocalSandbox user={user!r} is root: use user=None to keep root (not advised)")
    return ids if os.geteuid() == 0 else None


def _environment(scratch: Path) -> dict[str, str]:
    """Nothing of the caller's environment (tokens, cluster addresses) reaches the code."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(scratch),
        "TMPDIR": str(scratch),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        # Native thread pools each reserve address space: one thread keeps RLIMIT_AS meaningful.
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


async def _exited(proc: asyncio.subprocess.Process, timeout: float, watch: _Watch) -> str:
    """``exited`` when ``proc`` ended within ``timeout`` s, ``wall`` past it, ``budget`` when the
    call passed its budget first (``watch.exceeded``). ``proc.wait()`` would also wait for its pipes
    to close, which a background child holding them delays until the limit."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    pause = 0.002
    while proc.returncode is None:
        if loop.time() >= end:
            return "wall"
        if await watch.check():
            return "budget"
        await asyncio.sleep(min(pause, end - loop.time()))
        pause = min(pause * 2, 0.02)
    return "exited"


async def _read_capped(stream: asyncio.StreamReader, cap: int) -> tuple[bytes, bool]:
    """Read ``stream`` to EOF, keeping its first ``cap`` bytes; whether more came."""
    kept = bytearray()
    cut = False
    while chunk := await stream.read(_READ_CHUNK):
        room = cap - len(kept)
        if len(chunk) > room:
            cut = True
        if room > 0:
            kept += chunk[:room]
    return bytes(kept), cut


async def _feed(pipe: asyncio.StreamWriter, data: bytes) -> None:
    try:
        if data:
            pipe.write(data)
            await pipe.drain()
        pipe.close()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the code exited without reading all of its stdin


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_report(fd: int) -> dict[str, Any]:
    """Merge the child's JSON lines (``outer``, ``user``, ``exit``, ``fatal``) into one dict."""
    os.set_blocking(fd, False)
    data = b""
    while True:
        try:
            chunk = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    report: dict[str, Any] = {}
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            report.update(record)
    return report


def _isolation(report: dict[str, Any]) -> dict[str, Any]:
    """Which layer holds each kind of containment (``none``: nothing does)."""
    outer = report.get("outer", {})
    user = report.get("user", {})
    landlock = user.get("landlock", {})
    guard = set(user.get("guard", []))
    abi = landlock.get("abi", 0)
    layers = user.get("layers", {})
    budget = set(user.get("budget", []))

    def held(name: str) -> bool:
        return layers.get(name, {}).get("held", False)

    def pick(*layers: tuple[str, bool]) -> list[str]:
        return [name for name, held in layers if held] or ["none"]

    return {
        "network": pick(
            ("netns", outer.get("netns", False)),
            ("landlock-tcp", landlock.get("net", False)),
            ("guard", "network" in guard),
        ),
        "filesystem": pick(("landlock", abi >= 1), ("guard", "files" in guard)),
        "reads": pick(
            ("mountns", layers.get("mountns", {}).get("held", False)),
            ("landlock", landlock.get("reads", False)),
            ("guard", "reads" in guard),
        ),
        "privileges": pick(
            ("user", layers.get("user", {}).get("held", False)),
            ("seccomp", layers.get("seccomp", {}).get("held", False)),
        ),
        "processes": pick(
            ("cgroup-pids", held("cgroup")),
            ("rlimit-nproc", user.get("nproc") is not None),
            ("guard", "processes" in guard),
        ),
        "signals": pick(
            ("pid-namespace", outer.get("pidns", False)),
            ("landlock-scope", landlock.get("signals", False)),
            ("guard", "signals" in guard),
        ),
        "cleanup": ["pid-namespace", "process-group"] if outer.get("pidns") else ["process-group"],
        # The call's budget, all its processes together (else per process: the rlimits).
        "memory": pick(
            ("cgroup-memory", held("cgroup-memory")),
            ("namespace-accounting", "memory" in budget),
            ("rlimit-as", True),
        ),
        "cpu": pick(
            ("cgroup-cpu", held("cgroup-cpu")),
            ("namespace-accounting", "cpu_s" in budget),
            ("rlimit-cpu", True),
        ),
        "scratch": pick(("scratch-fs", held("scratch-fs")), ("caller-check", not held("scratch-fs"))),
        "ipc": pick(("ipcns", held("ipcns")), ("seccomp", held("seccomp") and not held("ipcns"))),
        # Socket kinds the filter lets through (every other family is refused where seccomp holds).
        "sockets": [k for k in user.get("seccomp_allow", []) if k in ("unix", "inet_tcp", "inet_other")],
        "private_proc": bool(user.get("proc", False)),
        "landlock_abi": abi,
        "uid": user.get("uid"),
        "guard": sorted(guard),
        # Each layer of LAYERS: {"held": bool, "why": why not, or ""}.
        "layers": layers,
    }


def _result(
    report: dict[str, Any],
    stdout: str,
    stderr: str,
    *,
    timed_out: bool,
    watch: _Watch | None = None,
    returncode: int | None,
    limits: SandboxLimits,
    truncated: bool,
    wall_s: float,
) -> SandboxResult:
    watch = watch or _Watch(None, limits, Path(os.devnull))
    common = {
        "stdout": stdout,
        "stderr": stderr,
        "wall_s": wall_s,
        "truncated": truncated,
        "isolation": _isolation(report),
        # The cgroup counts every process of the call; else the reaped processes' usage.
        "cpu_s": watch.cpu_s if watch.cpu_s is not None else report.get("cpu_s"),
    }
    if timed_out:
        return SandboxResult(
            status="timeout", message=f"killed after the wall-clock limit of {limits.wall_s:g} s", **common
        )
    over = _over_budget(report, watch, limits)
    if over is not None:
        status, message = over
        return SandboxResult(status=status, exit_code=_exit_code(report), message=message, **common)
    if "fatal" in report:
        return SandboxResult(status="error", exit_code=None, message=report["fatal"], **common)
    status = report.get("exit")
    if status is None:
        return SandboxResult(
            status="killed",
            exit_code=returncode,
            message=f"the sandbox's own process ended without a report (exit status {returncode})",
            **common,
        )
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        exit_code = -sig
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and (report.get("cpu_s") or 0) >= limits.cpu_s):
            return SandboxResult(
                status="timeout",
                exit_code=exit_code,
                message=f"killed at the CPU-time limit of {limits.cpu_s:g} s",
                **common,
            )
        return SandboxResult(
            status="killed", exit_code=exit_code, message=f"killed by {signal.Signals(sig).name}", **common
        )
    exit_code = os.WEXITSTATUS(status)
    if exit_code == 0:
        return SandboxResult(status="ok", exit_code=0, **common)
    last = stderr.rstrip().rsplit("\n", 1)[-1]
    if last.startswith("MemoryError"):
        return SandboxResult(
            status="memory",
            exit_code=exit_code,
            message=f"out of memory at the limit of {limits.memory_mib} MiB",
            **common,
        )
    return SandboxResult(status="error", exit_code=exit_code, message=f"exit code {exit_code}", **common)


def _exit_code(report: dict[str, Any]) -> int | None:
    status = report.get("exit")
    if status is None:
        return None
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _over_budget(report: dict[str, Any], watch: _Watch, limits: SandboxLimits) -> tuple[str, str] | None:
    """``(status, message)`` when the call passed one of its budgets (all its processes together), as
    the caller's watch, the namespace's init or the scratch tmpfs found it; else ``None``."""
    over = watch.exceeded or report.get("budget")
    scratch = report.get("scratch", {})
    if over is None and scratch.get("full_bytes"):
        over = {"limit": "max_scratch_bytes", "used": scratch["bytes"]}
    elif over is None and scratch.get("full_files"):
        over = {"limit": "max_scratch_files", "used": scratch["files"]}
    cpu = report.get("cpu_s") if watch.cpu_s is None else watch.cpu_s
    if over is None and cpu is not None and cpu > limits.cpu_s:
        over = {"limit": "cpu_s", "used": cpu}
    if over is None:
        return None
    limit, used = over["limit"], over.get("used")
    if limit == "cpu_s":
        return "timeout", (
            f"the call's processes used {used:.2f} CPU-seconds together, past the limit of "
            f"{limits.cpu_s:g} s (sandbox.limits.cpu_s); the call was ended"
        )
    if limit == "memory_mib":
        held = f" (at most {used / 2**20:.0f} MiB held at once)" if used else ""
        return "memory", (
            f"the call's processes together reached the memory limit of {limits.memory_mib} MiB "
            f"(sandbox.limits.memory_mib: every process of the call, shared memory and memfd included)"
            f"{held}; the call was ended"
        )
    if limit == "max_scratch_bytes":
        return "error", (
            f"the scratch directory reached its limit of {limits.max_scratch_bytes / 2**20:g} MiB "
            f"(sandbox.limits.max_scratch_bytes; {used / 2**20:.1f} MiB used)"
        )
    return "error", (
        f"the scratch directory reached its limit of {limits.max_scratch_files} files "
        f"(sandbox.limits.max_scratch_files; {used} used)"
    )


def _rmtree(path: Path) -> None:
    """Remove ``path`` even where the code took its own permissions away."""

    def retry(function: Any, failed: str, _exc: Any) -> None:
        try:
            os.chmod(os.path.dirname(failed), stat.S_IRWXU)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, stat.S_IRWXU)
            function(failed)
        except OSError:
            pass

    shutil.rmtree(path, onerror=retry)
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)

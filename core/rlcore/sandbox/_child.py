"""The sandbox's child side: run by a fresh interpreter (``python -I -S -c <this file> <config>``), never
imported by the trainer. Standard library only, and no rlcore: it runs before any user code, so it may
use privileges the code must not keep.

Process tree, one per call::

    outer   (new session; joins the pids cgroup; unshares net, pid [and user] namespaces)
     └ init (pid 1 of the new pid namespace, when there is one: reaps, and its exit kills every
     │       process left in the namespace)
        └ user (rlimits, Landlock, no_new_privs, audit-hook guard, then the user's ``main.py``)

Each layer that was asked for "auto" is applied when the kernel allows it and recorded; one asked for
"require" that fails ends the call with exit code :data:`FATAL` and a ``fatal`` report. Reports are
JSON lines on the inherited descriptor ``report_fd``; the user process closes its copy before the code
starts, so the last line (``exit``, written by the process that reaped the user process) is trusted.
"""

import ctypes
import json
import os
import resource
import signal
import sys

FATAL = 125

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38

# Landlock (linux/landlock.h); the syscall numbers are the same on every architecture.
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
FS_WRITE_FILE = 1 << 1
FS_WRITE_ABI1 = FS_WRITE_FILE | sum(1 << bit for bit in range(4, 13))  # remove_*, make_*
FS_REFER, FS_TRUNCATE = 1 << 13, 1 << 14
NET_BIND_TCP, NET_CONNECT_TCP = 1, 2
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2

_libc = ctypes.CDLL(None, use_errno=True)


def _errno_text() -> str:
    return os.strerror(ctypes.get_errno())


class Reporter:
    def __init__(self, fd: int):
        self.fd = fd

    def send(self, **record) -> None:
        if self.fd >= 0:
            os.write(self.fd, (json.dumps(record) + "\n").encode())

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def fatal(report: Reporter, text: str) -> None:
    report.send(fatal=text)
    sys.stderr.write(f"sandbox: {text}\n")
    sys.stderr.flush()
    os._exit(FATAL)


# -- outer: cgroup and namespaces ------------------------------------------------------------------
def join_cgroup(cfg: dict, report: Reporter) -> bool:
    path = cfg["cgroup"]
    if not path:
        return False
    try:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        return True
    except OSError as exc:
        if cfg["cgroup_mode"] == "require":
            fatal(report, f"could not join the pids cgroup {path}: {exc}")
        return False


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def unshare_namespaces(cfg: dict, report: Reporter) -> dict:
    """Enter new network and pid namespaces (inside a new user namespace when not root)."""
    if cfg["namespaces"] == "off":
        return {"netns": False, "pidns": False, "userns": False}
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS
    userns = uid != 0
    if userns:
        flags |= CLONE_NEWUSER
    if _libc.unshare(flags) != 0:
        why = _errno_text()
        if cfg["namespaces"] == "require":
            fatal(report, f"unshare(net, pid, mount{', user' if userns else ''}) failed: {why}")
        return {"netns": False, "pidns": False, "userns": False, "why": why}
    if userns:
        # Map our own ids, so files the code creates belong to the caller as usual.
        try:
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
        except OSError as exc:
            fatal(report, f"could not map ids in the new user namespace: {exc}")
    # A private /proc is mounted only if that mount cannot propagate to the caller's namespace.
    private = _libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) == 0
    return {"netns": True, "pidns": True, "userns": userns, "mounts_private": private}


def mount_private_proc() -> bool:
    """In the new pid namespace (as its pid 1): a /proc that shows only the sandbox's processes."""
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    return _libc.mount(b"proc", b"/proc", b"proc", flags, None) == 0


# -- user: limits, Landlock, guard ------------------------------------------------------------------
def set_rlimits(limits: dict, nproc: int | None) -> None:
    cpu = max(1, int(limits["cpu_s"] + 0.999))
    memory = int(limits["memory_mib"]) * 2**20
    pairs = [
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_AS, memory),
        (resource.RLIMIT_FSIZE, int(limits["max_file_bytes"])),
        (resource.RLIMIT_NOFILE, int(limits["max_open_files"])),
    ]
    if nproc is not None:
        pairs.append((resource.RLIMIT_NPROC, nproc))
    for kind, value in pairs:
        resource.setrlimit(kind, (value, value))
    # SIGXCPU at the soft limit (Python's default action ends the process), SIGKILL a second later.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))


def user_task_count(uid: int) -> int:
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{name}/task"))
            except OSError:
                pass
    return count


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]  # fmt: skip


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock(cfg: dict, report: Reporter) -> dict:
    """Allow writes only beneath the scratch directory (and to /dev/null); where the ABI has them,
    refuse TCP bind/connect and signals to processes outside the sandbox."""
    mode = cfg["landlock"]
    if mode == "off":
        return {"abi": 0}
    _libc.syscall.restype = ctypes.c_long
    abi = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 1:
        if mode == "require":
            fatal(report, f"Landlock is not available in this kernel: {_errno_text()}")
        return {"abi": 0, "why": _errno_text()}
    write = FS_WRITE_ABI1 | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0)
    attr = _RulesetAttr(write, NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0,
                        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)  # fmt: skip
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        fatal(report, f"landlock_create_ruleset failed: {_errno_text()}")
    file_write = FS_WRITE_FILE | (FS_TRUNCATE if abi >= 3 else 0)
    for path, allowed in ((cfg["scratch"], write), ("/dev/null", file_write)):
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        rule = _PathBeneathAttr(allowed, fd)
        if _libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0):
            fatal(report, f"landlock_add_rule({path}) failed: {_errno_text()}")
        os.close(fd)
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        fatal(report, f"prctl(PR_SET_NO_NEW_PRIVS) failed: {_errno_text()}")
    if _libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
        fatal(report, f"landlock_restrict_self failed: {_errno_text()}")
    os.close(ruleset)
    return {"abi": abi, "net": abi >= 4, "signals": abi >= 6}


_PATH_EVENTS = {
    # event -> indexes of path arguments, index of a dir_fd argument (or None)
    "os.chmod": ((0,), 2), "os.chown": ((0,), 3), "os.chflags": ((0,), None), "os.lchflags": ((0,), None),
    "os.link": ((0, 1), 2), "os.mkdir": ((0,), 2), "os.mkfifo": ((0,), 2), "os.mknod": ((0,), 3),
    "os.remove": ((0,), 1), "os.rename": ((0, 1), 2), "os.rmdir": ((0,), 1), "os.symlink": ((1,), 2),
    "os.truncate": ((0,), None), "os.utime": ((0,), 3), "os.setxattr": ((0,), None),
    "os.removexattr": ((0,), None), "shutil.rmtree": ((0,), 1),
}  # fmt: skip
_PROCESS_EVENTS = {"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                   "subprocess.Popen", "pty.spawn"}  # fmt: skip
AF_UNIX = 1  # Linux
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def install_guard(scratch: str, block: dict) -> None:
    """An audit hook refusing, inside this interpreter, what ``block`` names: writes outside
    ``scratch`` (``files``), non-Unix sockets (``network``), new processes (``processes``), signals to
    processes outside the sandbox's process group (``signals``), and loading native code through ctypes
    (``ctypes``, the way around every audit hook).

    A guard, not a boundary: code can still reach the kernel through a C extension already loaded.
    """
    root = os.path.realpath(scratch)
    allowed_files = {"/dev/null"}

    def inside(path) -> bool:
        if isinstance(path, int):
            return True  # an open descriptor: its opening was checked
        real = os.path.realpath(os.path.join(os.getcwd(), os.fsdecode(path)))
        return real == root or real.startswith(root + os.sep) or real in allowed_files

    def refuse(what: str) -> None:
        raise PermissionError(f"sandbox: {what} is not allowed")

    def hook(event: str, args: tuple) -> None:
        if block.get("files"):
            if event == "open":
                path, _mode, flags = args
                if flags & _WRITE_FLAGS and not inside(path):
                    refuse(f"writing {os.fsdecode(path)!r} (outside the scratch directory)")
                return
            spec = _PATH_EVENTS.get(event)
            if spec is not None:
                indexes, dir_fd = spec
                if dir_fd is not None and len(args) > dir_fd and args[dir_fd] not in (None, -1, -100):
                    refuse(f"{event} relative to a directory descriptor")
                for i in indexes:
                    if not inside(args[i]):
                        refuse(f"{event} on {os.fsdecode(args[i])!r} (outside the scratch directory)")
                return
        if block.get("network") and event == "socket.__new__":
            family = args[1]
            if family not in (-1, AF_UNIX):
                refuse("opening a network socket")
        elif block.get("network") and event in ("socket.getaddrinfo", "socket.gethostbyname"):
            refuse("name resolution")
        elif block.get("signals") and event in ("os.kill", "os.killpg"):
            target, _sig = args
            own = os.getpgrp()
            if event == "os.killpg":
                group = target
            elif target == 0:
                group = own
            elif target == -1:
                group = None  # every process we may signal
            elif target < -1:
                group = -target
            else:
                try:
                    group = os.getpgid(target)
                except OSError:
                    return  # no such process: the call fails on its own
            if group != own:
                refuse(f"signalling process {target} (outside the sandbox's process group)")
        elif block.get("processes") and event in _PROCESS_EVENTS:
            refuse(f"starting a process ({event})")
        elif block.get("ctypes") and event in ("ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle"):
            refuse("loading native code with ctypes")

    sys.addaudithook(hook)
    if block.get("processes"):
        # subprocess raises its audit event in Python; its C helper raises none, so replace it.
        import _posixsubprocess

        def fork_exec(*args, **kwargs):
            refuse("starting a process (_posixsubprocess.fork_exec)")

        _posixsubprocess.fork_exec = fork_exec


def run_user_code(cfg: dict, report: Reporter, outer: dict) -> int:
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    uid = os.geteuid()
    limits = cfg["limits"]
    # The kernel does not apply RLIMIT_NPROC to root; for another user it counts all their tasks
    # (threads included), so the limit is what they run now plus the sandbox's share.
    nproc_enforced = uid != 0
    # This process is counted already: the code may have max_processes, itself included.
    nproc = (user_task_count(uid) + int(limits["max_processes"]) - 1) if nproc_enforced else None
    ll = landlock(cfg, report)
    set_rlimits(limits, nproc)
    files = ll["abi"] >= 1
    network = outer["netns"] or ll.get("net", False)
    processes = outer["cgroup"] or nproc_enforced
    guard = {}
    if cfg["guard"]:
        signals = outer["pidns"] or ll.get("signals", False)
        guard = {
            "files": not files,
            "network": not network,
            "processes": not processes,
            "signals": not signals,
        }
        guard["ctypes"] = any(guard.values())
        guard = {k: v for k, v in guard.items() if v}
        install_guard(cfg["scratch"], guard)
    report.send(
        user={"landlock": ll, "nproc": nproc, "guard": sorted(guard), "proc": outer.get("proc", False)}
    )
    report.close()

    path = os.path.join(cfg["scratch"], "main.py")
    with open(path, encoding="utf-8") as f:
        source = f.read()
    sys.argv = [path]
    sys.path.insert(0, cfg["scratch"])
    sys.stdout.reconfigure(line_buffering=True)
    namespace = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
    try:
        exec(compile(source, path, "exec"), namespace)
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except BaseException as exc:
        import traceback

        # Drop this function's own frame: the traceback starts in the user's main.py.
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        return 1
    return 0


def wait_and_report(pid: int, report: Reporter) -> None:
    """Reap children until ``pid`` ends; report its raw wait status and resource use."""
    while True:
        try:
            done, status, usage = os.wait4(-1, 0)
        except ChildProcessError:
            return
        if done == pid:
            report.send(exit=status, cpu_s=usage.ru_utime + usage.ru_stime, max_rss_kib=usage.ru_maxrss)
            return


def main() -> None:
    cfg = json.loads(sys.argv[1])
    report = Reporter(cfg["report_fd"])
    cgroup = join_cgroup(cfg, report)
    outer = {"cgroup": cgroup, **unshare_namespaces(cfg, report)}
    report.send(outer=outer)
    # With a pid namespace the first child is its pid 1 (init); without one, the user process itself.
    pid = os.fork()
    if pid == 0:
        if outer["pidns"]:
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            outer["proc"] = outer["mounts_private"] and mount_private_proc()
            user = os.fork()
            if user == 0:
                sys.exit(run_user_code(cfg, report, outer))
            wait_and_report(user, report)
            os._exit(0)  # pid 1 leaving kills whatever the code left running
        sys.exit(run_user_code(cfg, report, outer))
    report_copy = report if not outer["pidns"] else Reporter(-1)
    if outer["pidns"]:
        report.close()
    wait_and_report(pid, report_copy)
    os._exit(0)


main()

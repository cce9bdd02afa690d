"""The sandbox's child side: run by a fresh interpreter (``python -I -S -c <this file> <config>``), never
imported by the trainer. Standard library only, and no rlcore: it runs before any user code, so it may
use privileges the code must not keep.

Process tree, one per call::

    outer   (new session; joins the call's cgroups; unshares net, pid, mount, IPC, cgroup [and user]
     │       namespaces; bounds SysV IPC in its IPC namespace)
     └ init (pid 1 of the new pid namespace, when there is one: builds the minimal read-only root with
     │       a size-limited scratch tmpfs and pivots into it, reaps, keeps the call's CPU and memory
     │       budget where no cgroup does, and its exit kills every process left in the namespace)
        └ user (Landlock, then the unprivileged uid, no capabilities, rlimits, no_new_privs, the
                seccomp filter, the audit-hook guard, then the user's ``main.py``)

Each layer that was asked for "auto" is applied when the kernel allows it and recorded; one asked for
"require" that fails ends the call with exit code :data:`FATAL` and a ``fatal`` report. Reports are
JSON lines on the inherited descriptor ``report_fd``; the user process closes its copy before the code
starts, so the last line (``exit``, written by the process that reaped the user process) is trusted.
``user.layers`` says of each layer of :data:`LAYERS` whether it held and, if not, why; a layer named
in ``require`` that did not hold ends the call before the code runs.
"""

import ctypes
import json
import os
import resource
import signal
import sys

FATAL = 125
#: Every layer a call may get (``sandbox.require`` names some of them), see ``docs/security.md``.
LAYERS = ("netns", "pidns", "mountns", "ipcns", "landlock", "landlock-net", "landlock-scope", "cgroup",
          "cgroup-memory", "cgroup-cpu", "scratch-fs", "user", "seccomp")  # fmt: skip

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC = 32, 4096, 0x4000
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_CAPBSET_DROP = 24
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

#: What the code may read besides its scratch directory: the interpreter (found from ``sys``), the
#: system's shared libraries and the dynamic linker's cache, time zone data, and these devices.
SYSTEM_READ = ("/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/local/lib", "/lib", "/lib64", "/lib32",
               "/etc/ld.so.cache", "/etc/localtime", "/usr/share/zoneinfo")  # fmt: skip
DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
#: What of its own ``/proc/self`` the code may read (with Landlock): not ``mountinfo``, ``mounts``,
#: ``cgroup``, ``net/``, ``ns/``, ``task/`` (a second way to all of them).
PROC_SELF = ("stat", "statm", "status", "limits", "cmdline", "comm", "maps", "smaps", "smaps_rollup", "io",
             "fd", "fdinfo")  # fmt: skip

# Landlock (linux/landlock.h); the syscall numbers are the same on every architecture.
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1, 1 << 1, 1 << 2, 1 << 3
FS_READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
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
def join_cgroup(cfg: dict, report: Reporter) -> dict:
    """Move into the call's cgroups -> ``{controller: held}`` (none held when a move fails)."""
    held = dict(cfg["cgroup_held"])
    try:
        for path in cfg["cgroups"]:
            with open(os.path.join(path, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
    except OSError as exc:
        if cfg["cgroup_mode"] == "require":
            fatal(report, f"could not join the call's cgroup {path}: {exc}")
        why = f"could not join the call's cgroup {path}: {exc}"
        cfg["cgroup_why"] = {name: why for name in held}
        return {name: False for name in held}
    return held


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def unshare_namespaces(cfg: dict, report: Reporter) -> dict:
    """Enter new network and pid namespaces (inside a new user namespace when not root)."""
    none = {"netns": False, "pidns": False, "ipcns": False, "userns": False}
    if cfg["namespaces"] == "off":
        return {**none, "why": "namespaces is off"}
    uid, gid = os.geteuid(), os.getegid()
    # The cgroup namespace (after joining the call's cgroups) shows them as "/": no host paths.
    flags = CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWCGROUP
    userns = uid != 0
    if userns:
        flags |= CLONE_NEWUSER
    cgroupns = _libc.unshare(flags) == 0
    if not cgroupns and _libc.unshare(flags & ~CLONE_NEWCGROUP) != 0:  # a kernel without cgroupns
        why = f"unshare(net, pid, mount, ipc{', user' if userns else ''}) failed: {_errno_text()}"
        if cfg["namespaces"] == "require":
            fatal(report, why)
        return {**none, "why": why}
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
    return {"netns": True, "pidns": True, "ipcns": True, "cgroupns": cgroupns, "userns": userns,
            "mounts_private": private, "ipc_limits": bound_ipc(cfg["limits"])}  # fmt: skip


def bound_ipc(limits: dict) -> bool:
    """In the call's new IPC namespace: SysV shared memory of at most ``memory_mib`` in all, few
    queues and semaphore sets (the namespace's own limits; its segments die with it)."""
    memory = int(limits["memory_mib"]) * 2**20
    settings = {"shmmax": memory, "shmall": memory // os.sysconf("SC_PAGE_SIZE"), "shmmni": 64,
                "msgmni": 16, "msgmnb": 65536, "sem": "32 1024 32 16"}  # fmt: skip
    try:
        for name, value in settings.items():
            _write(f"/proc/sys/kernel/{name}", str(value))
    except OSError:
        return False  # the namespace's defaults; the memory cgroup still counts what is touched
    return True


def mount_private_proc() -> bool:
    """In the new pid namespace (as its pid 1): a /proc that shows only the sandbox's processes."""
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    return _libc.mount(b"proc", b"/proc", b"proc", flags, None) == 0


# -- what the code may read ------------------------------------------------------------------------
def _resolve(path: str, links: list, depth: int = 0) -> str:
    """The real path of ``path``, recording each symlink met on the way as ``(link, target)``."""
    cur = "/"
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, part)
        if os.path.islink(nxt) and depth < 40:
            target = os.readlink(nxt)
            links.append((nxt, target))
            cur = _resolve(os.path.join(cur, target), links, depth + 1)
        else:
            cur = nxt
    return cur


def read_allowlist(cfg: dict) -> tuple[list, list]:
    """``(real paths the code may read, symlinks leading to them)``: this interpreter (its executable,
    ``pyvenv.cfg``, the libraries mapped into it, every ``sys.path`` entry: the standard library, plus
    site-packages where the interpreter was started with them), :data:`SYSTEM_READ` and
    ``cfg["read_paths"]``. Paths that do not exist are left out; so is a path beneath another."""
    bindir = os.path.dirname(sys.executable)  # a venv's pyvenv.cfg sits beside bin/ or in it
    wanted = [sys.executable, *SYSTEM_READ, *cfg["read_paths"]]
    wanted += [os.path.join(d, "pyvenv.cfg") for d in (bindir, os.path.dirname(bindir))]
    wanted += [p for p in sys.path if p]
    with open("/proc/self/maps") as f:
        wanted += [line.split(None, 5)[5].strip() for line in f if line.count(" ") >= 5 and "/" in line]
    links: list = []
    real = set()
    for path in wanted:
        if path.startswith("/") and os.path.lexists(path):
            resolved = _resolve(path, links)
            if os.path.exists(resolved):
                real.add(resolved)
    kept: list = []
    for path in sorted(real):
        if not any(path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept, list(dict.fromkeys(links))


# -- init: the minimal read-only root ---------------------------------------------------------------
def _mount(source, target: str, fstype, flags: int, data=None) -> None:
    enc = [x.encode() if isinstance(x, str) else x for x in (source, target, fstype, data)]
    if _libc.mount(enc[0], enc[1], enc[2], flags, enc[3]) != 0:
        raise OSError(ctypes.get_errno(), f"mount {target}: {_errno_text()}")


def _kept_flags(path: str) -> int:
    """The flags of the mount ``path`` is on: a remount (in a user namespace) may not clear them."""
    st = os.statvfs(path).f_flag
    flags = st & (MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME)
    return flags | (MS_RELATIME if st & 4096 else 0)


def mount_scratch(cfg: dict, target: str) -> str:
    """A tmpfs of ``max_scratch_bytes`` and ``max_scratch_files`` at ``target``, owned by the code's
    user, holding the call's ``main.py`` -> ``""``, or why not (then the scratch directory itself is
    bound there, and its use is checked by the caller)."""
    limits = cfg["limits"]
    uid, gid = cfg["scratch_owner"]
    main = os.path.join(cfg["scratch"], "main.py")
    try:
        with open(main, "rb") as f:
            code = f.read()
        options = (f"size={int(limits['max_scratch_bytes']) + len(code)},"
                   f"nr_inodes={int(limits['max_scratch_files']) + 2},mode=0700,uid={uid},gid={gid}")  # fmt: skip
        _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, options)
        with open(os.path.join(target, "main.py"), "wb") as f:
            f.write(code)
        os.chown(os.path.join(target, "main.py"), uid, gid)
    except OSError as exc:
        return f"could not mount the scratch tmpfs: {exc}"
    return ""


def build_root(cfg: dict, outer: dict, allow: list, links: list, report: Reporter) -> dict:
    """As init of the new pid and mount namespaces: a tmpfs at ``root_dir`` holding, at their own
    paths, read-only binds of ``allow``, the size-limited scratch tmpfs (writable, at the scratch
    directory's path), :data:`DEVICES` and a /proc of this pid namespace; the tmpfs is then made
    read-only and becomes ``/`` (``pivot_root``), and the old root is detached, so nothing else of
    the machine's file system is reachable."""
    mode = cfg["mountns"]
    if mode == "off":
        return {"held": False, "why": "mountns is off", "proc": False, "scratch_why": "mountns is off"}
    try:
        if not outer.get("mounts_private"):
            raise OSError(f"no private mount namespace ({outer.get('why') or 'namespaces are off'})")
        if cfg["pivot_root_nr"] is None:
            raise OSError("no pivot_root syscall number for this architecture")
        new = cfg["root_dir"]
        _mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")

        def bind(path: str, writable: bool = False, device: bool = False) -> None:
            target = new + path
            if os.path.isdir(path):
                os.makedirs(target, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                open(target, "a").close()
            _mount(path, target, None, MS_BIND | MS_REC)
            flags = _kept_flags(path) & ~(0 if not writable else MS_RDONLY)
            flags |= MS_NOSUID | (0 if writable else MS_RDONLY) | (0 if device else MS_NODEV)
            _mount(None, target, None, MS_BIND | MS_REMOUNT | flags)

        for path in allow:
            bind(path)
        os.makedirs(new + cfg["scratch"], exist_ok=True)
        scratch_why = mount_scratch(cfg, new + cfg["scratch"])
        if scratch_why:
            bind(cfg["scratch"], writable=True)
        for path in DEVICES:
            if os.path.exists(path):
                bind(path, writable=path == "/dev/null", device=True)
        for link, target in links:
            inside = any(link.startswith(p.rstrip("/") + "/") for p in allow)
            if not inside and not os.path.lexists(new + link):
                os.makedirs(os.path.dirname(new + link), exist_ok=True)
                os.symlink(target, new + link)
        os.makedirs(new + "/proc", exist_ok=True)
        try:  # refused in a user namespace where the machine's /proc is partly masked (containers)
            _mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            proc = True
        except OSError:
            proc = False
        _mount(None, new, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.chdir(new)
        if _libc.syscall(cfg["pivot_root_nr"], b".", b".") != 0:
            raise OSError(ctypes.get_errno(), f"pivot_root: {_errno_text()}")
        if _libc.umount2(b".", MNT_DETACH) != 0:
            raise OSError(ctypes.get_errno(), f"detaching the old root: {_errno_text()}")
        os.chdir("/")
    except OSError as exc:
        if mode == "require":
            fatal(report, f"could not build the read-only root: {exc}")
        return {"held": False, "why": str(exc), "proc": False, "scratch_why": f"no read-only root ({exc})"}
    return {"held": True, "proc": proc, "scratch_why": scratch_why}


# -- user: limits, Landlock, privileges, seccomp, guard ----------------------------------------------
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


def landlock(cfg: dict, allow: list, report: Reporter) -> dict:
    """Allow reads only of ``allow``, the scratch directory, :data:`DEVICES` and this process's own
    /proc entry, and writes only beneath the scratch directory (and to /dev/null); where the ABI has
    them, refuse TCP bind/connect and signals to processes outside the sandbox. With ``reads`` off,
    only writes are restricted."""
    mode = cfg["landlock"]
    if mode == "off":
        return {"abi": 0, "why": "landlock is off"}
    _libc.syscall.restype = ctypes.c_long
    abi = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 1:
        if mode == "require":
            fatal(report, f"Landlock is not available in this kernel: {_errno_text()}")
        return {"abi": 0, "why": f"Landlock is not available in this kernel: {_errno_text()}"}
    write = FS_WRITE_ABI1 | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0)
    reads = FS_READ if cfg["reads"] else 0
    attr = _RulesetAttr(write | reads, NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0,
                        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)  # fmt: skip
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        fatal(report, f"landlock_create_ruleset failed: {_errno_text()}")
    file_write = FS_WRITE_FILE | (FS_TRUNCATE if abi >= 3 else 0)
    file_read = reads & (FS_EXECUTE | FS_READ_FILE)
    rules = [(cfg["scratch"], write | reads), ("/dev/null", file_write | file_read)]
    if reads:
        rules += [(path, reads if os.path.isdir(path) else file_read) for path in allow]
        rules += [(path, file_read) for path in DEVICES[1:] if os.path.exists(path)]
        if os.path.isdir("/proc/self"):
            # Its own entry, less what shows the machine (mountinfo's host paths, cgroup, net/...).
            rules.append(("/proc/self", FS_READ_DIR))
            for name in PROC_SELF:
                path = f"/proc/self/{name}"
                if os.path.exists(path):
                    rules.append((path, FS_READ_FILE | (FS_READ_DIR if os.path.isdir(path) else 0)))
    for path, allowed in rules:
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
    return {"abi": abi, "reads": bool(reads), "net": abi >= 4, "signals": abi >= 6}


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _unreachable_for(uid: int, gid: int) -> str:
    """Why user ``uid`` could not run this interpreter (its ``sys.path``), or ``""``."""
    os.setegid(gid)
    os.seteuid(uid)
    try:
        for path in [os.path.dirname(os.__file__), *(p for p in sys.path if os.path.isdir(p))]:
            try:
                os.listdir(path)
            except OSError as exc:
                return f"uid {uid} cannot read the interpreter's {path} ({exc.strerror})"
        return ""
    finally:
        os.seteuid(0)
        os.setegid(0)


def plan_user(cfg: dict, report: Reporter) -> tuple:
    """``((uid, gid) to become or None, why not)``: ``cfg["user"]`` when we are root and that user can
    read the interpreter (the read-only root makes it so)."""
    target = cfg["user"]
    if os.geteuid() != 0:
        return None, ""  # unprivileged already (the caller's uid, in a user namespace or not)
    if not target:
        return None, "sandbox.user is null: the code runs as root (without capabilities)"
    os.setgroups([])
    why = _unreachable_for(*target)
    if why and cfg["user_mode"] == "require":
        fatal(report, f"cannot drop to user {target[0]}: {why}")
    return (None, why) if why else (tuple(target), "")


def drop_privileges(cfg: dict, plan: tuple, report: Reporter) -> dict:
    """Become the planned user, else (root, where that user could not run the interpreter) take the
    scratch directory back; then drop every capability (those a user namespace granted, too), so
    nothing the code does is privileged."""
    target, why = plan
    # The bounding set first: dropping from it needs CAP_SETPCAP, which the uid change takes away.
    for cap in range(64):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last capability: ignored
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if target:
        uid, gid = target
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    data = (_CapData * 2)()
    if _libc.capset(ctypes.byref(_CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)), data) != 0:
        fatal(report, f"capset (dropping every capability) failed: {_errno_text()}")
    uid = os.geteuid()
    return {"held": uid != 0, "uid": uid, "gid": os.getegid(), "why": why}


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp(cfg: dict, report: Reporter, allow: dict) -> dict:
    """The syscall filter of :mod:`rlcore.sandbox.seccomp` (built by the parent), its switches set
    by ``allow`` (``{switch: allowed}``, from the layers that held)."""
    mode = cfg["seccomp"]
    if mode == "off":
        return {"held": False, "why": "seccomp is off"}
    program = bytearray.fromhex(cfg["seccomp_filter"] or "")
    why = cfg["seccomp_why"]
    for name, index in cfg["seccomp_slots"].items():
        # The k field of the switch's RET instruction: allow, or EPERM.
        verdict = 0x7FFF0000 if allow.get(name) else 0x00050001
        program[index * 8 + 4 : index * 8 + 8] = verdict.to_bytes(4, sys.byteorder)
    if program:
        buffer = ctypes.create_string_buffer(bytes(program), len(program))
        prog = _SockFprog(len(program) // 8, ctypes.addressof(buffer))
        _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) == 0:
            return {"held": True, "allow": sorted(k for k, v in allow.items() if v)}
        why = f"prctl(PR_SET_SECCOMP) failed: {_errno_text()}"
    if mode == "require":
        fatal(report, why)
    return {"held": False, "why": why}


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


def install_guard(scratch: str, block: dict, readable: list) -> None:
    """An audit hook refusing, inside this interpreter, what ``block`` names: writes outside
    ``scratch`` (``files``), reads outside ``scratch`` and ``readable`` (``reads``), non-Unix sockets
    (``network``), new processes (``processes``), signals to
    processes outside the sandbox's process group (``signals``), and loading native code through ctypes
    (``ctypes``, the way around every audit hook).

    A guard, not a boundary: code can still reach the kernel through a C extension already loaded.
    """
    root = os.path.realpath(scratch)
    allowed_files = {"/dev/null"}
    read_roots = [root, *readable, *DEVICES, f"/proc/{os.getpid()}"]

    def real_path(path) -> str:
        return os.path.realpath(os.path.join(os.getcwd(), os.fsdecode(path)))

    def inside(path) -> bool:
        if isinstance(path, int):
            return True  # an open descriptor: its opening was checked
        real = real_path(path)
        return real == root or real.startswith(root + os.sep) or real in allowed_files

    def readable_path(path) -> bool:
        if isinstance(path, int):
            return True
        real = real_path(path)
        return any(real == r or real.startswith(r.rstrip("/") + "/") for r in read_roots)

    def refuse(what: str) -> None:
        raise PermissionError(f"sandbox: {what} is not allowed")

    def hook(event: str, args: tuple) -> None:
        if block.get("reads") and event in ("open", "os.listdir", "os.scandir"):
            path = args[0]
            reading = event != "open" or not args[2] & _WRITE_FLAGS
            if path is not None and reading and not readable_path(path):
                refuse(f"reading {os.fsdecode(path)!r} (not on the sandbox's read allowlist)")
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


def run_user_code(cfg: dict, report: Reporter, outer: dict, root: dict, allow: list) -> int:
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})  # init blocks it to poll
    os.chdir(cfg["scratch"])
    limits = cfg["limits"]
    plan = plan_user(cfg, report)
    uid = plan[0][0] if plan[0] else os.geteuid()  # the uid the code will run as
    # The kernel does not apply RLIMIT_NPROC to root; for another user it counts all their tasks
    # (threads included), so the limit is what they run now plus the sandbox's share. Only where no
    # pids cgroup holds: the cgroup bounds this call exactly, the rlimit every call of the user.
    nproc_enforced = uid != 0 and not outer["cgroup"]["pids"]
    # This process is counted already: the code may have max_processes, itself included.
    nproc = (user_task_count(uid) + int(limits["max_processes"]) - 1) if nproc_enforced else None
    ll = landlock(cfg, allow, report)
    user = drop_privileges(cfg, plan, report)
    set_rlimits(limits, nproc)
    switches = {
        "sysv": outer["ipcns"],
        "memfd": outer["cgroup"]["memory"],
        "unix": outer["netns"] and root["held"],
        "inet_tcp": outer["netns"] or ll.get("net", False),
        "inet_other": outer["netns"],
    }
    sc = install_seccomp(cfg, report, switches)
    reads = root["held"] or ll.get("reads", False)
    files = ll["abi"] >= 1
    network = outer["netns"] or ll.get("net", False)
    processes = outer["cgroup"]["pids"] or nproc is not None
    guard = {}
    if cfg["guard"]:
        signals = outer["pidns"] or ll.get("signals", False)
        guard = {
            "files": not files,
            "reads": not reads and cfg["reads"],
            "network": not network,
            "processes": not processes,
            "signals": not signals,
        }
        guard["ctypes"] = any(guard.values())
        guard = {k: v for k, v in guard.items() if v}
        install_guard(cfg["scratch"], guard, allow)
    missing = "no new namespaces"
    cgroup_why = cfg["cgroup_why"]
    layers = {
        "netns": (outer["netns"], outer.get("why", missing)),
        "pidns": (outer["pidns"], outer.get("why", missing)),
        "mountns": (root["held"], root.get("why", "")),
        "ipcns": (outer["ipcns"], outer.get("why", missing)),
        "landlock": (ll["abi"] >= 1 and ll.get("reads", False), ll.get("why", "reads are not restricted")),
        "landlock-net": (ll.get("net", False), ll.get("why", f"Landlock ABI {ll['abi']} < 4")),
        "landlock-scope": (ll.get("signals", False), ll.get("why", f"Landlock ABI {ll['abi']} < 6")),
        "cgroup": (outer["cgroup"]["pids"], cgroup_why.get("pids", "")),
        "cgroup-memory": (outer["cgroup"]["memory"], cgroup_why.get("memory", "")),
        "cgroup-cpu": (outer["cgroup"]["cpu"], cgroup_why.get("cpu", "")),
        "scratch-fs": (not root.get("scratch_why", "?"), root.get("scratch_why", "")),
        "user": (user["held"], user["why"]),
        "seccomp": (sc["held"], sc.get("why", "")),
    }
    layers = {name: {"held": bool(held), "why": "" if held else why} for name, (held, why) in layers.items()}
    report.send(
        user={
            "landlock": ll,
            "nproc": nproc,
            "guard": sorted(guard),
            "proc": root.get("proc") or outer.get("proc", False),
            "uid": user["uid"],
            "budget": outer.get("budget", []),
            "seccomp_allow": sc.get("allow", []),
            "layers": layers,
        }
    )
    for name in cfg["require"]:
        if not layers[name]["held"]:
            fatal(report, f"sandbox.require names {name!r}, which did not hold here: {layers[name]['why']}")
    if plan[1] and cfg["user"]:
        # Root without capabilities is still root to every file the machine's permissions guard.
        fatal(
            report,
            f"refusing to run the code as root: {plan[1]}, and without the read-only root "
            f"(mountns: {root.get('why') or 'held'}) nothing makes it readable. Give sandbox.options.python "
            "an interpreter that user can read, run where the mount namespace holds, or set "
            "sandbox.user: null to accept root without capabilities",
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


def call_pids(private_proc: bool) -> list:
    """The call's other processes: with the pid namespace's own /proc, all it lists; else this
    process's descendants (a subreaper keeps orphans among them), found by their parents."""
    me = os.getpid()
    numbers = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    if private_proc:
        return [pid for pid in numbers if pid != me]
    children: dict = {}
    for pid in numbers:
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [me]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def call_usage(pids: list, ipcns: bool) -> tuple:
    """(CPU seconds of the call's processes ``pids`` and of every reaped one; bytes they hold: each
    one's private resident memory, plus the SysV segments of the call's own IPC namespace)."""
    ticks, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    cpu = memory = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/statm") as f:
                statm = f.read().split()
        except OSError:
            continue  # ended meanwhile
        cpu += int(fields[11]) + int(fields[12])  # utime, stime
        memory += (int(statm[1]) - int(statm[2])) * page  # resident less file-backed and shared
    if ipcns:
        try:
            with open("/proc/sysvipc/shm") as f:
                memory += sum(int(line.split()[14]) for line in list(f)[1:])  # rss
        except (OSError, IndexError, ValueError):
            pass
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return cpu / ticks + reaped.ru_utime + reaped.ru_stime, memory


def kill_call(private_proc: bool) -> None:
    """SIGKILL every other process of the call."""
    if private_proc:
        try:
            os.kill(-1, signal.SIGKILL)  # pid 1's -1: every other process of its namespace
        except ProcessLookupError:
            pass
        return
    for pid in call_pids(False):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def scratch_usage(path: str) -> dict:
    """Bytes and files in the scratch tmpfs, and whether either is at its limit."""
    st = os.statvfs(path)
    return {"bytes": (st.f_blocks - st.f_bfree) * st.f_frsize, "files": st.f_files - st.f_ffree,
            "full_bytes": st.f_bavail == 0, "full_files": st.f_ffree == 0}  # fmt: skip


def wait_call(user: int, report: Reporter, cfg: dict, budget: dict, scratch_fs: bool, private: bool) -> None:
    """As the call's reaper (pid 1 of its namespace, ``private``: that namespace's /proc; else the outer
    process, a subreaper): reap until ``user`` ends, then end and reap every process left; report
    the user process's wait status, the CPU time of the whole call and the scratch use. ``budget``
    (``cpu_s``, ``memory``: what no cgroup keeps) is polled on each child's exit and every 50 ms;
    past it every process of the call is killed."""
    status = usage = exceeded = None
    ipcns = private and cfg.get("ipcns", False)
    while True:
        try:
            done, got, used = os.wait4(-1, os.WNOHANG if budget else 0)
        except ChildProcessError:
            break
        if done == user:
            status, usage = got, used
            break
        if done:
            continue
        cpu, memory = call_usage(call_pids(private), ipcns)
        if "cpu_s" in budget and cpu > budget["cpu_s"]:
            exceeded = {"limit": "cpu_s", "used": cpu}
        elif "memory" in budget and memory > budget["memory"]:
            exceeded = {"limit": "memory_mib", "used": memory}
        if exceeded:
            budget = {}  # from here, block until the user process is reaped
            kill_call(private)
            continue
        signal.sigtimedwait([signal.SIGCHLD], 0.05 if private else 0.1)
    kill_call(private)  # what the code left running ends with the call
    while True:
        try:
            os.wait4(-1, 0)
        except ChildProcessError:
            break
    total = resource.getrusage(resource.RUSAGE_CHILDREN)
    record = {"exit": status, "cpu_s": total.ru_utime + total.ru_stime,
              "max_rss_kib": usage.ru_maxrss if usage else None}  # fmt: skip
    if exceeded:
        record["budget"] = exceeded
    if scratch_fs:
        record["scratch"] = scratch_usage(cfg["scratch"])
    report.send(**record)


def call_budget(cfg: dict, cgroup: dict) -> dict:
    """What of the call's budget its reaper keeps: what no cgroup does."""
    budget = {}
    if not cgroup["cpu"]:
        budget["cpu_s"] = float(cfg["limits"]["cpu_s"])
    if not cgroup["memory"]:
        budget["memory"] = int(cfg["limits"]["memory_mib"]) * 2**20
    return budget


def main() -> None:
    cfg = json.loads(sys.argv[1])
    report = Reporter(cfg["report_fd"])
    cgroup = join_cgroup(cfg, report)
    outer = {"cgroup": cgroup, **unshare_namespaces(cfg, report)}
    report.send(outer=outer)
    allow, links = read_allowlist(cfg) if cfg["reads"] else ([], [])
    budget = {}
    if not outer["pidns"]:
        # This process reaps the user process and whatever it leaves (a subreaper keeps orphans
        # its descendants), and keeps the budget no cgroup does.
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        budget = call_budget(cfg, cgroup)
        outer["budget"] = sorted(budget)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    no_root = "reads are not restricted"
    root = {"held": False, "why": no_root, "proc": False, "scratch_why": f"no mount namespace ({no_root})"}
    # With a pid namespace the first child is its pid 1 (init); without one, the user process itself.
    pid = os.fork()
    if pid == 0:
        if outer["pidns"]:
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if cfg["reads"]:
                root = build_root(cfg, outer, allow, links, report)
            if not root["held"]:
                outer["proc"] = outer["mounts_private"] and mount_private_proc()
                if outer["mounts_private"] and cfg["mountns"] != "off":
                    # No read-only root, but the private mount namespace still takes the tmpfs.
                    root["scratch_why"] = mount_scratch(cfg, cfg["scratch"])
            private = bool(root["proc"] or outer.get("proc"))  # this namespace's /proc
            # Without it, /proc lists the machine: init reaps, the caller's cgroup or rlimits bound.
            budget = call_budget(cfg, cgroup) if private else {}
            outer["budget"] = sorted(budget)
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # sigtimedwait's, from now on
            user = os.fork()
            if user == 0:
                sys.exit(run_user_code(cfg, report, outer, root, allow))
            wait_call(
                user, report, {**cfg, "ipcns": outer["ipcns"]}, budget, not root["scratch_why"], private
            )
            os._exit(0)  # pid 1 leaving kills whatever the code left running
        if cfg["reads"] and cfg["mountns"] != "off":
            why = f"needs the pid namespace ({outer.get('why', 'namespaces are off')})"
            root = {"held": False, "why": why, "scratch_why": f"no mount namespace ({why})"}
            if cfg["mountns"] == "require":
                fatal(report, f"could not build the read-only root: {root['why']}")
        sys.exit(run_user_code(cfg, report, outer, root, allow))
    if outer["pidns"]:
        report.close()  # init reports
        wait_and_report(pid, Reporter(-1))
    else:
        wait_call(pid, report, cfg, budget, False, False)
    os._exit(0)


main()

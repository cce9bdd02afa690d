"""A cgroup per sandboxed call: one budget for all of the call's processes, kept by the kernel.

Per call, where this process may create cgroups (root, or a delegated subtree), a cgroup of each
controller found:

- ``pids``: at most ``max_processes`` tasks (threads count too) at once; a fork past it fails with
  ``EAGAIN``. ``RLIMIT_NPROC`` cannot do this for root (the kernel exempts it) and counts every
  process of a user.
- ``memory``: ``memory_mib`` for all the call's processes together, their shared memory, ``memfd``
  files, SysV segments and the scratch tmpfs included (all are charged to the cgroup that touched
  them), swap excluded; past it the kernel's OOM killer ends one, and the call is then ended as a
  whole (``memory``).
- ``cpu``: the accounting of the CPU time of every process of the call (``cpuacct.usage``, v2's
  ``cpu.stat``), which the caller polls and ends the call past ``cpu_s`` (``timeout``): no kernel limit
  on a cgroup's total CPU time exists, only on its rate.

cgroup v2 (the controllers enabled in our cgroup's ``subtree_control``) and v1 (a hierarchy per
controller, found in ``/proc/self/mounts``) are both found; every process left in the cgroups is killed
when the call ends.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path

#: The controllers a call's cgroup may have (v1 ``cpuacct`` serves ``cpu``).
CONTROLLERS = ("pids", "memory", "cpu")
_V1_NAMES = {"pids": "pids", "memory": "memory", "cpu": "cpuacct"}
#: The sandbox's own processes (its outer process and the pid namespace's init), beyond the code's.
HELPERS = 2

_counter = itertools.count()
_parent_cache: dict[int, dict[str, tuple[Path, int]]] = {}


def parents() -> dict[str, tuple[Path, int]]:
    """``{controller: (directory under which we may create cgroups, cgroup version)}`` for this
    process (cached per pid: a forked child must look again, its cgroup may differ)."""
    pid = os.getpid()
    if pid not in _parent_cache:
        _parent_cache[pid] = _find_parents()
    return _parent_cache[pid]


def pids_cgroup_parent() -> Path | None:
    """The directory under which per-call pids cgroups are made, or ``None``."""
    found = parents().get("pids")
    return found[0] if found else None


def _mounts() -> tuple[Path | None, dict[str, Path]]:
    """(the cgroup v2 mount point, {v1 controller: its hierarchy's mount point})."""
    unified, v1 = None, {}
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None, {}
    for line in lines:
        fields = line.split()
        if len(fields) < 4:
            continue
        if fields[2] == "cgroup2" and unified is None:
            unified = Path(fields[1])
        elif fields[2] == "cgroup":
            for option in fields[3].split(","):
                v1.setdefault(option, Path(fields[1]))
    return unified, v1


def _find_parents() -> dict[str, tuple[Path, int]]:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return {}
    unified, v1_mounts = _mounts()
    found: dict[str, tuple[Path, int]] = {}
    v1_paths: dict[str, str] = {}
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and controllers == "" and unified is not None:
            base = unified / path.lstrip("/")
            try:
                enabled = (base / "cgroup.subtree_control").read_text().split()
            except OSError:
                continue
            wanted = [c for c in ("pids", "memory") if c in enabled]
            if wanted and os.access(base, os.W_OK):
                # cpu.stat's usage is in every v2 cgroup, with the cpu controller or without.
                found.update({c: (base, 2) for c in [*wanted, "cpu"]})
        else:
            for name in controllers.split(","):
                v1_paths[name] = path
    for controller in CONTROLLERS:
        name = _V1_NAMES[controller]
        if controller in found or name not in v1_paths or name not in v1_mounts:
            continue
        base = v1_mounts[name] / v1_paths[name].lstrip("/")
        if (base / "cgroup.procs").exists() and os.access(base, os.W_OK):
            found[controller] = (base, 1)
    return found


def why_missing(controller: str) -> str:
    """Why ``controller`` has no per-call cgroup here."""
    return (
        f"no {controller} cgroup can be created here (needs root or a delegated cgroup subtree with the "
        f"{_V1_NAMES[controller] if controller == 'cpu' else controller} controller: v2 subtree_control, "
        "or a writable v1 hierarchy)"
    )


class CallGroup:
    """The cgroups of one call: ``dirs`` maps each controller held to its directory (under v2 one
    directory holds them all)."""

    def __init__(self, dirs: dict[str, tuple[Path, int]]):
        self.dirs = {c: d for c, (d, _v) in dirs.items()}
        self.versions = {c: v for c, (_d, v) in dirs.items()}

    @property
    def procs_dirs(self) -> list[str]:
        """The directories a process joins (by writing its pid to each one's ``cgroup.procs``)."""
        return sorted({str(d) for d in self.dirs.values()})

    def _read(self, controller: str, name: str) -> str | None:
        try:
            return (self.dirs[controller] / name).read_text()
        except (OSError, KeyError):
            return None

    def cpu_s(self) -> float | None:
        """CPU seconds used by every process that was in the call's cgroup."""
        if self.versions.get("cpu") == 1:
            text = self._read("cpu", "cpuacct.usage")
            return int(text) / 1e9 if text else None
        text = self._read("cpu", "cpu.stat")
        for line in (text or "").splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
        return None

    def oom_kills(self) -> int:
        """Processes the kernel's OOM killer ended at the call's memory limit."""
        name = "memory.oom_control" if self.versions.get("memory") == 1 else "memory.events"
        for line in (self._read("memory", name) or "").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def memory_peak(self) -> int | None:
        """The most bytes the call's processes held at once."""
        name = "memory.max_usage_in_bytes" if self.versions.get("memory") == 1 else "memory.peak"
        text = self._read("memory", name)
        return int(text) if text and text.strip().isdigit() else None


def create(max_processes: int, memory_mib: int) -> tuple[CallGroup | None, dict[str, str]]:
    """New cgroups for one call: ``max_processes`` tasks for the code (plus :data:`HELPERS`),
    ``memory_mib`` MiB for everything the call holds, and CPU accounting -> (the group or ``None``,
    ``{controller: why it is missing}``)."""
    found = parents()
    missing = {c: why_missing(c) for c in CONTROLLERS if c not in found}
    if not found:
        return None, missing
    name = f"rlcore-sandbox-{os.getpid()}-{next(_counter)}"
    made: dict[str, tuple[Path, int]] = {}
    by_dir: dict[Path, Path] = {}
    for controller, (base, version) in found.items():
        path = by_dir.get(base)
        try:
            if path is None:
                path = by_dir[base] = base / name
                path.mkdir()
            memory = int(memory_mib) * 2**20
            if controller == "pids":
                (path / "pids.max").write_text(str(max_processes + HELPERS))
            elif controller == "memory" and version == 1:
                (path / "memory.limit_in_bytes").write_text(str(memory))
                _try_write(path / "memory.memsw.limit_in_bytes", str(memory))  # no swap to escape to
            elif controller == "memory":
                (path / "memory.max").write_text(str(memory))
                _try_write(path / "memory.swap.max", "0")
                _try_write(path / "memory.oom.group", "1")  # one OOM kill ends the whole call
        except OSError as exc:
            missing[controller] = f"could not set up the {controller} cgroup {path}: {exc}"
            continue
        made[controller] = (path, version)
    for path in set(by_dir.values()) - {p for p, _v in made.values()}:
        remove(path)
    return (CallGroup(made) if made else None), missing


def _try_write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError:
        pass  # absent on this kernel (no swap accounting ...): nothing to limit


def kill_all(group: CallGroup, deadline_s: float = 5.0) -> None:
    """SIGKILL every process in the call's cgroups until they are empty (a fork racing the kill is
    caught by the next round)."""
    dirs = [Path(d) for d in group.procs_dirs]
    for path in dirs:
        kill_file = path / "cgroup.kill"  # cgroup v2, Linux 5.14+: the kernel does the loop
        if kill_file.exists():
            try:
                kill_file.write_text("1")
            except OSError:
                pass
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        pids: set[int] = set()
        for path in dirs:
            try:
                pids.update(int(p) for p in (path / "cgroup.procs").read_text().split())
            except OSError:
                pass
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


def remove(target: CallGroup | Path) -> None:
    """Kill what is left in the call's cgroups and remove them (an empty cgroup directory is removed
    with rmdir)."""
    if isinstance(target, Path):
        paths = [target]
    else:
        kill_all(target)
        paths = [Path(d) for d in target.procs_dirs]
    for path in paths:
        if not path.exists():
            continue
        end = time.monotonic() + 5.0
        while True:
            try:
                path.rmdir()
                break
            except OSError:
                # Killed processes leave the cgroup when the kernel has reaped them, a moment later.
                if time.monotonic() > end:
                    break
                time.sleep(0.01)

"""A pids cgroup per sandboxed call: the kernel's limit on how many processes the code may have at once.

``RLIMIT_NPROC`` cannot do this for root (the kernel exempts it) and counts every process of a user, so
where this process may create cgroups (root, or a delegated cgroup v2 subtree) each call gets its own
``pids`` cgroup, and every process left in it is killed when the call ends. cgroup v2 (``pids`` enabled
in our cgroup's ``subtree_control``) and v1 (a ``pids`` hierarchy) are both found.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path

_counter = itertools.count()
_parent_cache: dict[int, Path | None] = {}


def pids_cgroup_parent() -> Path | None:
    """A cgroup directory of this process under which we may create pids cgroups, or ``None``."""
    pid = os.getpid()  # a forked child must look again: its cgroup may differ
    if pid not in _parent_cache:
        _parent_cache[pid] = _find_parent()
    return _parent_cache[pid]


def _find_parent() -> Path | None:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and controllers == "":
            base = Path("/sys/fs/cgroup") / path.lstrip("/")
            try:
                enabled = (base / "cgroup.subtree_control").read_text().split()
            except OSError:
                continue
            if "pids" in enabled and os.access(base, os.W_OK):
                return base
        elif "pids" in controllers.split(","):
            base = Path("/sys/fs/cgroup/pids") / path.lstrip("/")
            if (base / "cgroup.procs").exists() and os.access(base, os.W_OK):
                return base
    return None


def create(max_processes: int, owner: tuple[int, int] | None = None) -> Path | None:
    """A new pids cgroup allowing ``max_processes`` tasks (threads count too) for the code, plus the
    sandbox's own two (its outer process and the pid namespace's init), or ``None``. ``owner``
    (uid, gid) may then move itself in."""
    parent = pids_cgroup_parent()
    if parent is None:
        return None
    path = parent / f"rlcore-sandbox-{os.getpid()}-{next(_counter)}"
    try:
        path.mkdir()
        (path / "pids.max").write_text(str(max_processes + 2))
        if owner is not None:
            os.chown(path / "cgroup.procs", *owner)
    except OSError:
        remove(path)
        return None
    return path


def kill_all(path: Path, deadline_s: float = 5.0) -> None:
    """SIGKILL every process in the cgroup until it is empty (a fork racing the kill is caught by the
    next round)."""
    kill_file = path / "cgroup.kill"  # cgroup v2, Linux 5.14+: the kernel does the loop
    if kill_file.exists():
        try:
            kill_file.write_text("1")
        except OSError:
            pass
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
        except OSError:
            return
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


def remove(path: Path) -> None:
    """Kill what is left in the cgroup and remove it (an empty cgroup directory is removed with rmdir)."""
    if not path.exists():
        return
    kill_all(path)
    end = time.monotonic() + 5.0
    while True:
        try:
            path.rmdir()
            return
        except OSError:
            # Killed processes leave the cgroup when the kernel has reaped them, a moment later.
            if time.monotonic() > end:
                return
            time.sleep(0.01)

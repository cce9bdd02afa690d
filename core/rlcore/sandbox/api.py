"""The sandbox contract: run untrusted Python code somewhere else, under limits, and say what happened.

A :class:`Sandbox` never raises for anything the code does (a crash, a loop, a fork bomb, a refused
write) nor for a sandbox service that is down: every outcome is a :class:`SandboxResult` whose
``status`` says which. So one bad sample or tool call cannot end a training run.

>>> from rlcore.sandbox import get_sandbox
>>> get_sandbox("local").run_sync("print(6 * 7)").stdout
'42\\n'
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures as cf
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs

#: What can happen to one call. ``ok``: exited 0. ``error``: a nonzero exit (an exception, a refused
#: write or connection ...) or a sandbox that could not run the code (``message`` says which).
#: ``timeout``: wall-clock or CPU-time limit. ``memory``: the memory limit (``MemoryError``).
#: ``killed``: ended by a signal (a crash in native code, the kernel's OOM killer ...).
STATUSES = ("ok", "error", "timeout", "memory", "killed")

#: The isolation layers of the local sandbox, each held or missing per call
#: (``SandboxResult.isolation["layers"]``); ``sandbox.require`` names those that must hold. What each
#: one enforces is in ``docs/security.md``.
LAYERS = ("netns", "pidns", "mountns", "ipcns", "landlock", "landlock-net", "landlock-scope", "cgroup",
          "cgroup-memory", "cgroup-cpu", "scratch-fs", "user", "seccomp")  # fmt: skip

T = TypeVar("T")


def _positive(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    if not value > 0:
        raise ValueError(f"sandbox.limits.{attribute.name} must be > 0, got {value!r}")


@attrs.frozen(kw_only=True)
class SandboxLimits:
    """Limits of one sandboxed call. A remote sandbox applies those its API carries (wall time, memory)."""

    #: CPU seconds of the whole call, all its processes together (the cgroup's accounting, or the pid
    #: namespace's; ``RLIMIT_CPU`` per process too); a ``timeout`` past it.
    cpu_s: float = attrs.field(default=10.0, validator=_positive)
    #: Wall-clock seconds before the whole call is killed (``timeout``).
    wall_s: float = attrs.field(default=20.0, validator=_positive)
    #: Memory in MiB: the address space of each process (``RLIMIT_AS``: an allocation past it raises
    #: ``MemoryError``) and what all the call's processes hold together, shared memory, ``memfd`` and
    #: the scratch tmpfs included (a memory cgroup, or the pid namespace's accounting); ``memory``.
    memory_mib: int = attrs.field(default=1024, validator=_positive)
    #: Bytes of stdout and of stderr kept each; the rest is dropped (``truncated``).
    max_output_bytes: int = attrs.field(default=64 * 1024, validator=_positive)
    #: Processes (threads count too) the code may have at once, itself included (a pids cgroup, or
    #: ``RLIMIT_NPROC`` for a caller that is not root).
    max_processes: int = attrs.field(default=16, validator=_positive)
    #: Largest file the code may write, in bytes (``RLIMIT_FSIZE``).
    max_file_bytes: int = attrs.field(default=64 * 2**20, validator=_positive)
    #: Open file descriptors (``RLIMIT_NOFILE``).
    max_open_files: int = attrs.field(default=256, validator=_positive)
    #: Bytes the call may keep in its scratch directory, all files together (a size-limited tmpfs, or
    #: the caller's walk where none can be mounted); an ``error`` naming the limit past it.
    max_scratch_bytes: int = attrs.field(default=256 * 2**20, validator=_positive)
    #: Files and directories the call may make in its scratch directory (the tmpfs's inodes).
    max_scratch_files: int = attrs.field(default=10_000, validator=_positive)


@attrs.frozen(kw_only=True)
class SandboxResult:
    """What one call did. ``stdout``/``stderr`` are decoded UTF-8 (bad bytes replaced), each cut to
    ``limits.max_output_bytes``."""

    #: One of :data:`STATUSES`.
    status: str = attrs.field(validator=attrs.validators.in_(STATUSES))
    stdout: str = ""
    stderr: str = ""
    #: The program's exit code; ``-N`` when signal N ended it; ``None`` when it never ran or was killed
    #: before it could say.
    exit_code: int | None = None
    #: Seconds from start to end of the call, as the caller saw them.
    wall_s: float = 0.0
    #: CPU seconds the code used, where the sandbox measures it.
    cpu_s: float | None = None
    #: Whether stdout or stderr was cut to the output limit.
    truncated: bool = False
    #: The sandbox's own word on a non-``ok`` outcome (which limit, why it could not run ...), else ``""``.
    message: str = ""
    #: Which isolation layers held for this call (see ``docs/agents.md``, "The sandbox").
    isolation: dict[str, Any] = attrs.field(factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def describe(self) -> str:
        """The result as one text for a tool message: output, then errors, then the status if not ok."""
        parts = [self.stdout.rstrip("\n")] if self.stdout else []
        if self.stderr:
            parts.append(self.stderr.rstrip("\n"))
        if not self.ok:
            parts.append(f"[{self.status}{': ' + self.message if self.message else ''}]")
        elif self.truncated:
            parts.append("[output truncated]")
        return "\n".join(parts)


class Sandbox(abc.ABC):
    """Runs Python source in isolation. Implementations are registered with ``register_sandboxes`` and
    built as ``cls(limits=..., **options)``; ``limits`` is the default of every :meth:`run`."""

    #: The registered name (``local``, ``http`` ...), for messages.
    name: str = "sandbox"

    def __init__(self, *, limits: SandboxLimits | None = None):
        self.limits = limits or SandboxLimits()

    @abc.abstractmethod
    async def run(self, code: str, *, stdin: str = "", limits: SandboxLimits | None = None) -> SandboxResult:
        """Run ``code`` as a Python program's main file with ``stdin``; never raises for what the code
        does or for an unreachable service (those are results). Safe to call many times at once."""

    def run_sync(self, code: str, *, stdin: str = "", limits: SandboxLimits | None = None) -> SandboxResult:
        """:meth:`run` from synchronous code (a reward function in a worker process)."""
        return run_coroutine_sync(lambda: self.run(code, stdin=stdin, limits=limits))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(limits={self.limits})"


def run_coroutine_sync(make: Callable[[], Awaitable[T]]) -> T:
    """Run the coroutine ``make()`` to completion from synchronous code and return its result.

    Outside an event loop it runs in a fresh one in this thread: an exception raised into it (the
    reward worker's per-sample ``SIGALRM`` timeout) cancels the coroutine, so a sandbox kills its child
    and removes its scratch directory on the way out. Inside a running loop (which this call must not
    block re-entrantly) it runs in a fresh loop on a helper thread.
    """

    async def main() -> T:
        return await make()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    with cf.ThreadPoolExecutor(1, thread_name_prefix="rlcore-sandbox") as pool:
        return pool.submit(asyncio.run, main()).result()

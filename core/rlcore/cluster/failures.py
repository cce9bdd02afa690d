"""What the driver raises when a worker fails, and how it finds the worker's last log lines.

Three kinds of failure, three exceptions:

- :class:`WorkerError`: a worker method raised; the worker process is alive. The message carries the
  role, rank, phase (the method) and the worker-side traceback.
- :class:`WorkerFailure`: the worker process died (``os._exit``, a signal, the OOM killer, a lost node).
  The message carries the role, rank, phase, where the process ran, why Ray thinks it died, and the tail
  of the worker's own stdout/stderr log, so a crash is diagnosable from the driver's output alone.
- :class:`WorkerTimeout`: a call did not finish within ``trainer.call_timeout_s`` (a hang: a collective
  whose peer never came, a stuck engine). The message carries the role, the engine and its plugin, the
  phase, the ranks still running, and the tail of the first one's log.

Both pickle with their fields (they cross from Ray workers to the driver).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Lines of each of a dead worker's stdout and stderr quoted in a :class:`WorkerFailure`.
LOG_TAIL_LINES = 30
# Ray's log monitor writes these marker lines into worker logs; they say nothing to a reader.
_RAY_MARKERS = (":job_id:", ":actor_name:", ":task_name:", ":task_attempt_start:", ":task_attempt_end:")


class WorkerError(RuntimeError):
    """A worker method raised. ``detail`` is ``"ExcType: message"``, ``worker_traceback`` the remote
    traceback text, ``source`` the engine and the plugin and package it came from (once the worker knows
    its engine), so that an error inside a third party's engine says whose it is."""

    def __init__(
        self, role: str, rank: int, phase: str, detail: str, worker_traceback: str = "", source: str = ""
    ):
        self.role, self.rank, self.phase = role, rank, phase
        self.detail, self.worker_traceback, self.source = detail, worker_traceback, source
        where = f" ({source})" if source else ""
        message = f"{role} rank {rank}{where} failed in {phase}: {detail}"
        if worker_traceback:
            message += "\n--- traceback in the worker ---\n" + worker_traceback.rstrip()
        super().__init__(message)

    def __reduce__(self):
        return (
            type(self),
            (self.role, self.rank, self.phase, self.detail, self.worker_traceback, self.source),
        )


class WorkerFailure(RuntimeError):
    """A worker process died while running ``phase``.

    ``where`` describes the process (``pid``, ``node_ip``, ``node_id``, ``hostname``); ``reason`` is
    Ray's account of the death; ``log_tail`` the last lines of the worker's log (may be empty when the
    log could not be read from the driver, in which case ``log_note`` says why and where it lies).
    """

    def __init__(
        self,
        role: str,
        rank: int,
        phase: str,
        reason: str,
        where: Mapping[str, Any] | None = None,
        log_tail: str = "",
        log_note: str = "",
    ):
        self.role, self.rank, self.phase, self.reason = role, rank, phase, reason
        self.where, self.log_tail, self.log_note = dict(where or {}), log_tail, log_note
        place = ", ".join(f"{k} {self.where[k]}" for k in ("pid", "hostname", "node_ip") if self.where.get(k))
        lines = [f"{role} rank {rank} died during {phase}" + (f" ({place})" if place else "") + f": {reason}"]
        if log_note:
            lines.append(log_note)
        if log_tail:
            lines.append("--- last lines of the worker's log ---")
            lines.append(log_tail.rstrip())
        super().__init__("\n".join(lines))

    def __reduce__(self):
        return (
            type(self),
            (self.role, self.rank, self.phase, self.reason, self.where, self.log_tail, self.log_note),
        )


class WorkerTimeout(TimeoutError):
    """Ranks ``ranks`` of ``role`` did not finish ``phase`` within ``timeout_s`` seconds; the driver stopped
    the group. ``source`` names the engine and its plugin; ``log_tail`` is the last lines of the first
    stuck rank's log (``log_note`` says why it is empty, when it is); ``setting`` what to raise if the
    engine is only slow."""

    def __init__(
        self,
        role: str,
        ranks: list[int],
        phase: str,
        timeout_s: float,
        source: str = "",
        log_tail: str = "",
        log_note: str = "",
        setting: str = "trainer.call_timeout_s",
    ):
        self.role, self.ranks, self.phase, self.timeout_s = role, list(ranks), phase, timeout_s
        self.setting = setting
        self.rank = self.ranks[0] if self.ranks else -1
        self.source, self.log_tail, self.log_note = source, log_tail, log_note
        where = f" ({source})" if source else ""
        lines = [
            f"{role} rank(s) {self.ranks}{where} did not finish {phase} within {timeout_s:g} s "
            f"({setting}); the group was stopped. An engine that is only slow: raise {setting}; a hang: "
            "the worker's log shows where it stopped"
        ]
        if log_note:
            lines.append(log_note)
        if log_tail:
            lines.append(f"--- last lines of rank {self.rank}'s log ---")
            lines.append(log_tail.rstrip())
        super().__init__("\n".join(lines))

    def __reduce__(self):
        return (
            type(self),
            (
                self.role,
                self.ranks,
                self.phase,
                self.timeout_s,
                self.source,
                self.log_tail,
                self.log_note,
                self.setting,
            ),
        )


def read_tail(path: str | os.PathLike, lines: int = LOG_TAIL_LINES, max_bytes: int = 256 * 1024) -> list[str]:
    """The last ``lines`` lines of a text file (reading at most ``max_bytes`` from its end), without
    Ray's marker lines."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        start = max(0, size - max_bytes)
        f.seek(start)
        text = f.read().decode("utf-8", errors="replace")
    lines_read = text.splitlines()
    if start > 0 and lines_read:
        lines_read = lines_read[1:]  # began mid-line
    kept = [line for line in lines_read if not line.startswith(_RAY_MARKERS)]
    return kept[-lines:]


def worker_log_tail(where: Mapping[str, Any], lines: int = LOG_TAIL_LINES) -> tuple[str, str]:
    """``(tail, note)`` for the worker described by ``where`` (what ``ping`` returned).

    Reads the files behind the worker's stdout/stderr (``stdout_path``/``stderr_path``) when they are
    visible from this process (same host or a shared file system). Otherwise asks Ray's state API,
    which fetches logs from any node of the cluster when the dashboard runs. ``note`` says why nothing
    could be read, and where the log lies.
    """
    paths = {"stderr": where.get("stderr_path"), "stdout": where.get("stdout_path")}
    sections: list[str] = []
    unreadable: list[str] = []
    for stream, path in paths.items():
        if not path:
            continue
        try:
            tail = read_tail(path, lines)
        except OSError:
            tail = _tail_via_ray_state(where, Path(path).name, lines)
            if tail is None:
                unreadable.append(str(path))
                continue
        if tail:
            sections.append(f"[{stream}]\n" + "\n".join(tail))
    note = ""
    if unreadable:
        host = where.get("hostname") or where.get("node_ip") or "the worker's node"
        note = f"log not readable from the driver; see {', '.join(unreadable)} on {host}"
    elif not sections and any(paths.values()):
        note = "the worker's log is empty"
    elif not any(paths.values()):
        note = "the worker never reported where its log is (it died before its first ping)"
    return "\n".join(sections), note


def _tail_via_ray_state(where: Mapping[str, Any], filename: str, lines: int) -> list[str] | None:
    """Log lines fetched through Ray's state API (works across nodes; needs the dashboard)."""
    node_id = where.get("node_id")
    if not node_id:
        return None
    try:
        from ray.util.state import get_log

        text = "".join(get_log(node_id=node_id, filename=filename, tail=lines, timeout=10))
    except Exception:  # no dashboard, node gone, file rotated: fall back to naming the file
        return None
    return [line for line in text.splitlines() if not line.startswith(_RAY_MARKERS)][-lines:]


def death_reason(error: BaseException) -> str:
    """Ray's account of why an actor died, without its generic troubleshooting advice."""
    text = str(getattr(error, "error_msg", None) or error).strip()
    if getattr(error, "actor_init_failed", False):
        last = [line for line in text.splitlines() if line.strip()][-1:] or [type(error).__name__]
        return "its constructor raised " + last[0].strip()
    cut = text.find(" Some common causes")
    if cut > 0:
        text = text[:cut]
    detail_at = text.find("Worker exit type")
    if detail_at >= 0:
        return text[detail_at:].strip()
    return text.splitlines()[0] if text else type(error).__name__

"""What reaches the terminal during a run: the run's own lines; engine and library output goes to files.

Engines and the libraries under them write to the process's file descriptors directly: C++ warnings
(NUMA binding, tcmalloc), tqdm bars ("Loading weights"), Python ``warnings``, vLLM's and Ray's loggers.
Filtering them one logger at a time never ends, so ``trainer.log_level: quiet`` (the default) points
file descriptors 1 and 2 of every process of the run at a log file under ``runs/<name>/logs/``: the
driver's at ``driver.log`` for the length of the run, each Ray worker's at ``<role>-<rank>.log`` for its
life. The driver's progress, step lines and errors are printed on a stream kept on the original
terminal. Any other level leaves the descriptors alone: workers' output then streams to the terminal
through Ray as before, and library loggers print at that level.

>>> import logging
>>> python_level("quiet") == logging.INFO and python_level("debug") == logging.DEBUG
True
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

#: Values of ``trainer.log_level``: ``quiet`` keeps library output off the terminal (in the run's log
#: files); the others show it on the terminal, at that level for Python loggers.
LOG_LEVELS = ("quiet", "warning", "info", "debug")
#: Set by the driver for its workers (forwarded like every ``RLCORE_*`` variable): the folder their
#: output goes to. Unset: workers keep Ray's own log files and stream to the driver.
LOG_DIR_ENV = "RLCORE_LOG_DIR"
LOGS_DIR = "logs"
DRIVER_LOG = "driver.log"


def python_level(log_level: str) -> int:
    """The ``logging`` level for library loggers: what quiet mode writes to the files is ``INFO``."""
    return logging.INFO if log_level == "quiet" else getattr(logging, log_level.upper())


def worker_log_name(role: str, rank: int) -> str:
    return f"{role}-{rank}.log"


def redirect_output(log_file: Path) -> None:
    """Point this process's stdout and stderr (file descriptors 1 and 2, so C and C++ code too) at
    ``log_file``, appending, for the rest of the process's life: a worker's whole output."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


@contextlib.contextmanager
def output_to_file(log_file: Path) -> Iterator[TextIO]:
    """For the block, this process's stdout and stderr go to ``log_file``; yields a text stream on the
    original stdout for the lines that belong on the terminal. Restored on exit."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(saved[0]), "w", buffering=1, encoding=sys.stdout.encoding or "utf-8")
    try:
        redirect_output(log_file)
        yield terminal
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(ValueError, OSError):
                stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        terminal.close()


@contextlib.contextmanager
def run_output(run_dir: Path, log_level: str) -> Iterator[TextIO | None]:
    """The terminal policy of one run in this (driver) process. ``quiet``: the driver's output goes to
    ``run_dir/logs/driver.log`` and workers started in the block are told (:data:`LOG_DIR_ENV`) to
    write to the same folder; yields the terminal stream. Otherwise yields None and changes nothing
    but the level of library loggers."""
    with _library_logging(python_level(log_level)):
        if log_level != "quiet":
            yield None
            return
        logs = run_dir / LOGS_DIR
        previous = os.environ.get(LOG_DIR_ENV)
        os.environ[LOG_DIR_ENV] = str(logs)
        try:
            with output_to_file(logs / DRIVER_LOG) as terminal:
                yield terminal
        finally:
            if previous is None:
                os.environ.pop(LOG_DIR_ENV, None)
            else:
                os.environ[LOG_DIR_ENV] = previous


@contextlib.contextmanager
def _library_logging(level: int) -> Iterator[None]:
    """Python loggers without a handler of their own print to stderr at ``level`` for the block (the log
    file in quiet mode); a root handler the user configured is left as it is."""
    root = logging.getLogger()
    previous = root.level
    handler = None
    if not root.handlers:
        handler = logging.StreamHandler()  # sys.stderr: descriptor 2, the log file in quiet mode
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(level)
    try:
        yield
    finally:
        root.setLevel(previous)
        if handler is not None:
            root.removeHandler(handler)

"""What a stage is made of: processes to run, one after another or side by side, and small steps between.

A stage's ``build(ctx)`` returns a list of these; ``device.py`` runs them on the GPU machine and ``show``
prints them here, so the commands in the docs are the ones that run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

PY = "python3"  # the GPU machine's interpreter (it has no `python`)


class MissingKnob(SystemExit):
    """A stage needs an environment variable that was not given."""


@dataclass(frozen=True)
class Ctx:
    """What a stage's commands depend on: the results folder and the caller's environment knobs."""

    res: str = "/tmp/res"
    env: Mapping[str, str] = field(default_factory=dict)
    #: Half the host's cores: each of two runs side by side gets this many (``BENCH_HOST_CPUS``).
    half_cpus: str = "$HALF"
    #: True when only describing the commands (``show``, ``plan``): a missing knob reads ``$NAME``.
    describing: bool = True

    @classmethod
    def on_device(cls) -> Ctx:
        return cls(
            res=os.environ.get("RES", "/tmp/res"),
            env=dict(os.environ),
            half_cpus=str(max(1, (os.cpu_count() or 2) // 2)),
            describing=False,
        )

    def knob(self, name: str, default: str) -> str:
        return self.env.get(name) or default

    def require(self, name: str, why: str) -> str:
        value = self.env.get(name)
        if value:
            return value
        if self.describing:
            return f"${name}"
        raise MissingKnob(f"this stage needs {name}=... ({why})")


@dataclass(frozen=True)
class Run:
    """One process: its output in ``<res>/<name>.log``, ended by ``timeout`` after ``limit`` seconds."""

    name: str
    limit: int
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    #: PYTHONPATH for this process; None: the stage's (``/tmp/proj`` then its bundles' sites).
    path: tuple[str, ...] | None = None
    #: What to print when it ends: a regular expression for the lines to show, else the log's last ``tail``.
    show: str | None = None
    tail: int = 30
    #: Append to the log instead of starting it anew (the model-writing helper's shared models.log).
    append: bool = False


@dataclass(frozen=True)
class Parallel:
    """Branches run at the same time (one GPU each), each branch's actions one after another."""

    branches: tuple[tuple[object, ...], ...]


@dataclass(frozen=True)
class FreeGpu:
    """End every process holding the GPU open: a crashed engine's scheduler otherwise keeps its memory."""


@dataclass(frozen=True)
class Unless:
    """Run ``actions`` unless ``path`` exists (a model an earlier stage on this machine already wrote)."""

    path: str
    actions: tuple[object, ...]


@dataclass(frozen=True)
class Do:
    """A small step in Python (copying results, removing an old run folder), described by ``text``."""

    text: str
    fn: Callable[[Ctx], None]


def cmd(*parts: object) -> tuple[str, ...]:
    """An argv from words and word lists (``cmd(PY, "x.py", ARGS, "--out", path)``)."""
    out: list[str] = []
    for p in parts:
        if isinstance(p, (list, tuple)):
            out.extend(str(x) for x in p)
        elif p is not None and p != "":
            out.append(str(p))
    return tuple(out)


def words(text: str) -> tuple[str, ...]:
    return tuple(text.split())

"""What runs inside a reward worker process (or inline): score samples, each under a time limit.

Everything here is picklable plain data and light to import (no torch), because worker processes import
this module. A sample's time limit is a ``SIGALRM`` timer that interrupts the scorer between Python
bytecodes; scorers blocked inside native code are caught by the driver's backstop instead.
"""

from __future__ import annotations

import importlib
import math
import numbers
import os
import signal
import threading
import traceback
from functools import partial
from typing import Any

from rlcore.rewards.functions import ScoreFn, load_reward_function, reward_function_for

#: One sample: ``(row, data_source, solution_str, ground_truth, extra_info)``.
Item = tuple[int, str, str, Any, Any]
#: ``(path, name, kwargs)`` of a user function that scores every sample, or ``None`` for the registry.
CustomSpec = tuple[str, str, dict[str, Any]] | None
#: ``(row, status, payload)``: ``("ok", (score, extra_dict))``, ``("error", text)``, ``("timeout", None)``.
Outcome = tuple[int, str, Any]

_scorers: dict[Any, ScoreFn] = {}


class SampleTimeout(BaseException):
    """Raised into a scorer when its time is up (a BaseException, so ``except Exception`` in user code
    does not swallow it)."""


class BadResult(ValueError):
    """A scorer returned something that is not a score."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise SampleTimeout


def adopt_env(env: dict[str, str]) -> None:
    """Pool initializer: take the driver's ``RLCORE_*`` variables (the run's ``RLCORE_SANDBOX`` ...).

    A forkserver child inherits the environment of the server, which started with the first pool of
    the process: a later run in the same process would otherwise see the first run's values."""
    for key in [k for k in os.environ if k.startswith("RLCORE_") and k not in env]:
        del os.environ[key]
    os.environ.update(env)


def ping(custom: CustomSpec) -> int:
    """Warm a worker up (import the user file, if any) and return its pid."""
    if custom is not None:
        _scorer(custom, "", None)
    return os.getpid()


def reference(fn: ScoreFn) -> str | None:
    """``"module:qualname"`` that imports back to ``fn``, or ``None`` (a lambda, a closure ...).

    Workers import a scorer by reference instead of loading every plugin (and torch with them).
    """
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        return None
    try:
        return f"{module}:{qualname}" if _import(f"{module}:{qualname}") is fn else None
    except Exception:
        return None


def _import(ref: str) -> ScoreFn:
    module, _, qualname = ref.partition(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _scorer(custom: CustomSpec, data_source: str, ref: str | None) -> ScoreFn:
    key = (custom[0], custom[1]) if custom is not None else data_source
    fn = _scorers.get(key)
    if fn is None:
        if custom is not None:
            fn = load_reward_function(custom[0], custom[1])
        else:
            fn = _import(ref) if ref is not None else reward_function_for(data_source)
        _scorers[key] = fn
    return partial(fn, **custom[2]) if custom is not None and custom[2] else fn


def score_items(
    custom: CustomSpec, refs: dict[str, str | None], items: list[Item], timeout_s: float
) -> list[Outcome]:
    """Score ``items`` one by one; a failure or timeout of one sample does not affect the others.

    ``refs`` maps data sources to :func:`reference` strings of their scorers (unused with ``custom``).
    """
    can_alarm = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGALRM, _on_alarm) if can_alarm else None
    outcomes: list[Outcome] = []
    try:
        for row, data_source, solution_str, ground_truth, extra_info in items:
            try:
                fn = _scorer(custom, data_source, refs.get(data_source))
                if can_alarm:
                    signal.setitimer(signal.ITIMER_REAL, timeout_s)
                try:
                    value = fn(
                        data_source=data_source,
                        solution_str=solution_str,
                        ground_truth=ground_truth,
                        extra_info=extra_info,
                    )
                finally:
                    if can_alarm:
                        signal.setitimer(signal.ITIMER_REAL, 0)
                outcomes.append((row, "ok", normalize_result(value)))
            except SampleTimeout:
                outcomes.append((row, "timeout", None))
            except BadResult as exc:
                outcomes.append((row, "error", str(exc)))
            except Exception as exc:
                outcomes.append((row, "error", "".join(traceback.format_exception(exc)).rstrip()))
    finally:
        if can_alarm:
            signal.signal(signal.SIGALRM, previous)
    return outcomes


def normalize_result(value: Any) -> tuple[float, dict[str, Any]]:
    """``(score, extra)`` from a scorer's return value: a finite number, a dict with a numeric ``score``
    (its other keys become ``extra``), or, as verl accepts, a tuple/list whose first item is the score."""
    extra: dict[str, Any] = {}
    score = value
    if isinstance(value, dict):
        if "score" not in value:
            raise BadResult(
                f"the reward function returned a dict without a 'score' key (keys: {sorted(value)}); "
                "put the reward under 'score'."
            )
        score = value["score"]
        extra = {k: v for k, v in value.items() if k != "score"}
    elif isinstance(value, tuple | list) and value:
        score = value[0]
    if not isinstance(score, numbers.Real):
        raise BadResult(
            f"the reward function returned {type(score).__name__} {score!r:.80}; it must return a number or a "
            "dict with a numeric 'score'."
        )
    score = float(score)
    if not math.isfinite(score):
        raise BadResult(f"the reward function returned the non-finite score {score}.")
    return score, extra

"""Calling registered functions with the inputs they name.

An estimator names only the inputs it uses (``rloo`` has no ``values``, ``gae`` no ``index``); a caller
holding everything a batch offers passes it all through :func:`call_with_available`, which hands each
function the arguments its signature asks for. A function with ``**kwargs`` receives everything.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any


def _parameters(fn: Callable[..., Any]) -> tuple[dict[str, inspect.Parameter], bool]:
    params = inspect.signature(fn).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = {
        n: p
        for n, p in params.items()
        if p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    }
    return named, takes_any


def call_with_available(
    fn: Callable[..., Any],
    available: Mapping[str, Any],
    required: Mapping[str, Any] | None = None,
    *,
    what: str = "function",
) -> Any:
    """Call ``fn`` with the entries of ``available`` its signature names, plus all of ``required``.

    ``available``: inputs a function may use (unused ones are dropped). ``required``: inputs the user asked
    for explicitly (``clip_cov_ratio=...``); one that ``fn`` does not accept is an error, so a typo in a
    config key cannot be silently ignored. A required parameter of ``fn`` that nobody supplies is an error
    naming it.
    """
    named, takes_any = _parameters(fn)
    required = dict(required or {})
    unknown = [k for k in required if k not in named and not takes_any]
    if unknown:
        raise TypeError(
            f"{what} does not accept {', '.join(map(repr, unknown))}; it takes {', '.join(named) or 'no keywords'}"
        )
    kwargs = {k: v for k, v in available.items() if takes_any or k in named}
    kwargs.update(required)
    missing = [
        n
        for n, p in named.items()
        if p.default is inspect.Parameter.empty
        and n not in kwargs
        and p.kind is not inspect.Parameter.POSITIONAL_ONLY
    ]
    if missing:
        raise TypeError(f"{what} needs {', '.join(map(repr, missing))}, which the caller did not provide")
    return fn(**kwargs)

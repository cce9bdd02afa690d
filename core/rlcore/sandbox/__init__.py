"""Sandboxed code execution: model-written Python runs in another process (or on a sandbox service),
never in the trainer.

>>> from rlcore.sandbox import SandboxLimits, get_sandbox
>>> result = get_sandbox("local").run_sync("print(input()[::-1])", stdin="abc")
>>> result.status, result.stdout
('ok', 'cba\\n')
>>> get_sandbox("local").run_sync("while True: pass", limits=SandboxLimits(wall_s=1)).status
'timeout'

Sandboxes are plugins (hook ``register_sandboxes``); ``local`` and ``http`` are built in. What each
layer of the local sandbox guarantees is in ``docs/agents.md``, "The sandbox".
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from rlcore.sandbox.api import STATUSES, Sandbox, SandboxLimits, SandboxResult, run_coroutine_sync
from rlcore.sandbox.config import SANDBOX_ENV, SandboxConfig, default_sandbox_config, export_default

__all__ = [
    "BUILTIN_SANDBOXES",
    "SANDBOX_ENV",
    "STATUSES",
    "Sandbox",
    "SandboxConfig",
    "SandboxError",
    "SandboxLimits",
    "SandboxResult",
    "default_sandbox",
    "default_sandbox_config",
    "export_default",
    "get_sandbox",
    "run_coroutine_sync",
]


#: Built-in sandboxes (registered by ``rlcore.builtin.sandboxes`` from this table).
BUILTIN_SANDBOXES = {
    "local": "rlcore.sandbox.local:LocalSandbox",
    "http": "rlcore.sandbox.http:HttpSandbox",
}


class SandboxError(ValueError):
    """A sandbox could not be built (unknown name, bad options); the message says what to do."""


def get_sandbox(name: str = "local", **options: Any) -> Sandbox:
    """Build the sandbox registered as ``name`` with ``options`` (``limits=`` and its own keywords).

    A built-in name is imported directly: loading every plugin (torch with them) would cost a reward
    worker seconds on its first sample. Other names come from the ``sandboxes`` registry.
    """
    if name in BUILTIN_SANDBOXES:
        module, _, attr = BUILTIN_SANDBOXES[name].partition(":")
        cls = getattr(importlib.import_module(module), attr)
    else:
        from rlcore.plugins import registry
        from rlcore.registry import RegistryError

        try:
            cls = registry("sandboxes").get(name)
        except RegistryError as exc:
            raise SandboxError(f"{exc}\nSet sandbox.name to one of the installed sandboxes.") from exc
    try:
        return cls(**options)
    except TypeError as exc:
        raise SandboxError(
            f"sandbox {name!r} ({cls.__module__}.{cls.__qualname__}) does not take these options: {exc}. "
            "Check sandbox.options."
        ) from exc


_defaults: dict[str, Sandbox] = {}


def default_sandbox() -> Sandbox:
    """The run's sandbox (the driver's ``sandbox:`` section, see :func:`export_default`), built once per
    process and section."""
    key = os.environ.get(SANDBOX_ENV, "")
    if key not in _defaults:
        _defaults[key] = default_sandbox_config().build()
    return _defaults[key]

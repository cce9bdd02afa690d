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

import os

from rlcore.sandbox.api import STATUSES, Sandbox, SandboxLimits, SandboxResult, run_coroutine_sync
from rlcore.sandbox.config import SANDBOX_ENV, SandboxConfig, default_sandbox_config, export_default
from rlcore.sandbox.factory import BUILTIN_SANDBOXES, SandboxError, get_sandbox

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


_defaults: dict[str, Sandbox] = {}


def default_sandbox() -> Sandbox:
    """The run's sandbox (the driver's ``sandbox:`` section, see :func:`export_default`), built once per
    process and section."""
    key = os.environ.get(SANDBOX_ENV, "")
    if key not in _defaults:
        _defaults[key] = default_sandbox_config().build()
    return _defaults[key]

"""Built-in sandboxes (default plugin): ``local`` (a limited child process on this machine) and ``http``
(a SandboxFusion-style service). Targets are lazy strings, so loading plugins imports neither."""

from __future__ import annotations

from rlcore import hookimpl
from rlcore.sandbox import BUILTIN_SANDBOXES


@hookimpl
def register_sandboxes(register):
    for name, target in BUILTIN_SANDBOXES.items():
        register(name, target)

"""Building a sandbox by its registered name: the built-in ones directly, others from the plugins'
``sandboxes`` registry. Below :mod:`rlcore.sandbox.config`, whose ``SandboxConfig.build`` calls it."""

from __future__ import annotations

import importlib
from typing import Any

from rlcore.sandbox.api import Sandbox

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
        from rlcore.plugins.registries import RegistryError

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

"""The ``sandbox:`` section of the config: where tool code and code rewards run, and under which limits."""

from __future__ import annotations

from typing import Any

import attrs

from rlcore.sandbox.api import Sandbox, SandboxLimits


@attrs.define(kw_only=True)
class SandboxConfig:
    """The sandbox that runs model-written code (the python tool, code rewards). ``local`` runs each call
    in a limited child process here; ``http`` sends it to a SandboxFusion-style service."""

    #: Sandbox plugin, by registered name (``local``, ``http``; plugins may add others).
    name: str = "local"
    #: Limits of each call.
    limits: SandboxLimits = attrs.Factory(SandboxLimits)
    #: Keyword arguments of the sandbox's constructor. ``local``: ``namespaces``, ``landlock``, ``cgroup``
    #: (``auto``/``require``/``off``), ``guard``, ``site_packages``, ``python``, ``max_concurrency``.
    #: ``http``: ``url`` (required), ``request_timeout_s``, ``max_concurrency``, ``headers``.
    options: dict[str, Any] = attrs.Factory(dict)

    def build(self) -> Sandbox:
        """The configured sandbox."""
        from rlcore.sandbox import get_sandbox

        return get_sandbox(self.name, limits=self.limits, **self.options)

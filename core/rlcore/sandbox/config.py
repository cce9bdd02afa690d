"""The ``sandbox:`` section of the config: where model-written code runs, and under which limits.

A driver makes its section the default of every process of the run with :func:`export_default`: the
section travels as JSON in ``RLCORE_SANDBOX``, and ``RLCORE_*`` variables reach every Ray worker (and
the reward worker processes they start). :func:`default_sandbox_config` reads it back there; with the
variable unset it is the ``local`` sandbox with default limits.
"""

from __future__ import annotations

import json
import os
from typing import Any

import attrs

from rlcore.sandbox.api import Sandbox, SandboxLimits
from rlcore.sandbox.factory import get_sandbox

#: Environment variable carrying the run's ``sandbox:`` section as JSON.
SANDBOX_ENV = "RLCORE_SANDBOX"


@attrs.define(kw_only=True)
class SandboxConfig:
    """The sandbox that runs model-written code (code rewards, the python tool). ``local`` runs each call
    in a limited child process on this machine; ``http`` sends it to a SandboxFusion-style service."""

    #: Sandbox plugin, by registered name (``local``, ``http``; plugins may add others).
    name: str = "local"
    #: Default limits of each call (a caller may pass its own: the code reward does, per test).
    limits: SandboxLimits = attrs.Factory(SandboxLimits)
    #: Keyword arguments of the sandbox's constructor. ``local``: ``namespaces``, ``landlock``, ``cgroup``
    #: (``auto``/``require``/``off``), ``guard``, ``user``, ``site_packages``, ``python``, ``max_concurrency``.
    #: ``http``: ``url`` (required), ``request_timeout_s``, ``max_concurrency``, ``headers``.
    options: dict[str, Any] = attrs.Factory(dict)

    def build(self) -> Sandbox:
        """The configured sandbox."""
        return get_sandbox(self.name, limits=self.limits, **self.options)


def export_default(config: SandboxConfig) -> None:
    """Make ``config`` the default sandbox of this process and of the workers it starts from now on."""
    os.environ[SANDBOX_ENV] = json.dumps(
        {"name": config.name, "limits": attrs.asdict(config.limits), "options": config.options}
    )


def default_sandbox_config() -> SandboxConfig:
    """The sandbox section exported by the driver (:func:`export_default`), or the defaults."""
    raw = os.environ.get(SANDBOX_ENV)
    if not raw:
        return SandboxConfig()
    try:
        data = json.loads(raw)
        return SandboxConfig(
            name=data.get("name", "local"),
            limits=SandboxLimits(**data.get("limits", {})),
            options=dict(data.get("options", {})),
        )
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(
            f"{SANDBOX_ENV}={raw[:200]!r} is not a sandbox section ({exc}). It holds JSON like "
            '{"name": "http", "limits": {"wall_s": 10}, "options": {"url": "http://host:8080"}}; unset it '
            "for the local sandbox."
        ) from exc

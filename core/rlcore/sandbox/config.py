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

from rlcore.sandbox.api import LAYERS, Sandbox, SandboxLimits
from rlcore.sandbox.factory import get_sandbox

#: Environment variable carrying the run's ``sandbox:`` section as JSON.
SANDBOX_ENV = "RLCORE_SANDBOX"


def _known_layers(instance: Any, attribute: attrs.Attribute, value: list[str]) -> None:
    unknown = [name for name in value if name not in LAYERS]
    if unknown:
        raise ValueError(f"sandbox.require: unknown layer(s) {unknown}; the layers are {', '.join(LAYERS)}")


@attrs.define(kw_only=True)
class SandboxConfig:
    """The sandbox that runs model-written code (code rewards, the python tool). ``local`` runs each call
    in a limited child process on this machine; ``http`` sends it to a SandboxFusion-style service."""

    #: Sandbox plugin, by registered name (``local``, ``http``; plugins may add others).
    name: str = "local"
    #: Default limits of each call (a caller may pass its own: the code reward does, per test).
    limits: SandboxLimits = attrs.Factory(SandboxLimits)
    #: Keyword arguments of the sandbox's constructor. ``local``: ``namespaces``, ``mountns``, ``landlock``,
    #: ``cgroup``, ``seccomp`` (``auto``/``require``/``off``), ``guard``, ``reads``, ``read_paths``,
    #: ``site_packages``, ``python``, ``max_concurrency``. ``http``: ``url`` (required),
    #: ``request_timeout_s``, ``max_concurrency``, ``headers``.
    options: dict[str, Any] = attrs.Factory(dict)
    #: ``local``: the user the code runs as when the trainer is root (a name, or a uid in quotes: "65534"); the
    #: sandbox drops to it before the code starts. ``null`` keeps root (not advised). A trainer that
    #: is not root keeps its own uid. The code never has capabilities (``docs/security.md``).
    user: str | None = "nobody"
    #: ``local``: isolation layers that must hold (``netns``, ``pidns``, ``mountns``, ``ipcns``,
    #: ``landlock``, ``landlock-net``, ``landlock-scope``, ``cgroup``, ``cgroup-memory``, ``cgroup-cpu``,
    #: ``scratch-fs``, ``user``, ``seccomp``), or ``rlcore train`` refuses to start naming the missing
    #: one (and each call fails). ``rlcore env`` shows which hold.
    require: list[str] = attrs.field(factory=list, validator=_known_layers)

    def build(self) -> Sandbox:
        """The configured sandbox."""
        return get_sandbox(self.name, limits=self.limits, **self.sandbox_options())

    def missing_layers(self) -> list[str]:
        """One line per layer of ``require`` that does not hold here, found by one trivial call (what
        ``rlcore train`` checks before it starts); ``[]`` when all hold or none is required."""
        if not self.require:
            return []
        if self.name != "local":
            return [f"'sandbox.require' names layers of the local sandbox, but sandbox.name is {self.name!r}"]
        result = self.build().run_sync("pass")
        layers = result.isolation.get("layers", {})
        problems = []
        for name in self.require:
            layer = layers.get(name, {"held": False, "why": result.message or "the sandbox did not run"})
            if not layer["held"]:
                problems.append(
                    f"'sandbox.require': layer {name!r} does not hold on this machine: {layer['why']}. "
                    "Run where it holds, or remove it from sandbox.require (`rlcore env` lists the layers "
                    "that hold; docs/security.md says what each one enforces)"
                )
        return problems

    def sandbox_options(self) -> dict[str, Any]:
        """The constructor's keywords: ``options``, with ``user`` and ``require`` for ``local``."""
        if self.name != "local":
            return dict(self.options)
        return {"user": self.user, "require": list(self.require), **self.options}


def export_default(config: SandboxConfig) -> None:
    """Make ``config`` the default sandbox of this process and of the workers it starts from now on."""
    os.environ[SANDBOX_ENV] = json.dumps(
        {
            "name": config.name,
            "limits": attrs.asdict(config.limits),
            "options": config.options,
            "user": config.user,
            "require": list(config.require),
        }
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
            user=data.get("user", "nobody"),
            require=list(data.get("require", [])),
        )
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(
            f"{SANDBOX_ENV}={raw[:200]!r} is not a sandbox section ({exc}). It holds JSON like "
            '{"name": "http", "limits": {"wall_s": 10}, "options": {"url": "http://host:8080"}}; unset it '
            "for the local sandbox."
        ) from exc

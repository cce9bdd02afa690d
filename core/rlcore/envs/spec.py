"""What an environment is made of: its requirements, the driver environment it overlays, and the hash
that names its folder."""

from __future__ import annotations

import hashlib
import json
import os
import site
import sys
from pathlib import Path
from typing import Any

import attrs
from packaging.requirements import InvalidRequirement, Requirement

#: The variable naming a node's folder of environments; each node reads its own (a node-local disk may
#: sit elsewhere on each), so the driver never forwards it to workers.
HOME_ENV = "RLCORE_ENV_HOME"
#: Where environments live when ``RLCORE_ENV_HOME`` is unset.
DEFAULT_HOME = "~/.cache/rlcore/envs"


class EnvironmentProblem(ValueError):
    """An environment cannot be defined (an unknown name, a bad requirement); the message says which."""


def env_home() -> Path:
    """This node's folder of environments: ``$RLCORE_ENV_HOME``, else ``~/.cache/rlcore/envs``."""
    return Path(os.environ.get(HOME_ENV) or DEFAULT_HOME).expanduser()


def base_paths() -> tuple[str, ...]:
    """The driver environment's package folders, in its order: ``PYTHONPATH``'s entries, then its
    ``site-packages`` (a venv's, or a system Python's several) and the user's site. Every overlay reads
    these after its own, and its workers start without ``PYTHONPATH``, so the overlay comes first."""
    entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    entries += site.getsitepackages()
    if site.ENABLE_USER_SITE:
        entries.append(site.getusersitepackages())
    seen: dict[str, None] = {}
    for entry in entries:
        path = os.path.abspath(entry)
        if os.path.isdir(path):
            seen.setdefault(path)
    return tuple(seen)


@attrs.frozen
class EnvSpec:
    """One environment: ``requirements`` (pip's syntax, sorted), met by its own ``site-packages`` (pip
    installs there what ``sites`` and ``base`` lack), then ``sites`` (folders of installed packages, such
    as ``pip install --target DIR``, for machines without a registry), then ``base`` (the package
    folders of the environment that runs rlcore, :func:`base_paths`), for Python ``python`` (``"3.11"``)."""

    name: str
    requirements: tuple[str, ...]
    base: tuple[str, ...]
    python: str
    sites: tuple[str, ...] = ()
    #: Where the requirements came from, for messages (``environments.requirements.x`` or a plugin).
    source: str = attrs.field(default="", eq=False)

    @property
    def key(self) -> str:
        """12 hex digits of the SHA-256 of requirements, base and Python: the folder's suffix."""
        text = json.dumps([list(self.requirements), list(self.base), self.python, list(self.sites)])
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def dirname(self) -> str:
        return f"{self.name}-{self.key}"

    def path(self, home: Path | None = None) -> Path:
        return (home or env_home()) / self.dirname

    def build_command(self) -> str:
        """The command that builds this environment on a node (run there, with the driver's rlcore)."""
        defined_in_config = self.source.startswith("environments.")
        return f"{rlcore_command()} env build {self.name}" + (
            " --config <this run's config>" if defined_in_config else ""
        )


def rlcore_command() -> str:
    """How to run this rlcore: its ``rlcore`` script beside the interpreter, else ``python -m``."""
    script = Path(sys.executable).with_name("rlcore")
    return str(script) if script.is_file() else f"{sys.executable} -m rlcore.cli.main"


def _normalise(requirements: list[str], where: str) -> tuple[str, ...]:
    out = []
    for line in requirements:
        try:
            out.append(str(Requirement(line)))
        except (InvalidRequirement, TypeError) as exc:
            raise EnvironmentProblem(f"{where}: {line!r} is not a pip requirement ({exc})") from None
    return tuple(sorted(set(out)))


def plugin_requirements(name: str) -> tuple[list[str], str] | None:
    """``(requirements, source)`` of plugin ``name``'s own environment, or ``None`` if no such plugin:
    what its entry-point module declares in ``RLCORE_PLUGIN_ENV`` (``["rlcore-sglang[cuda]"]``), else the
    plugin's distribution itself at its installed version."""
    from rlcore.plugins import get_plugin_manager

    info = get_plugin_manager().plugins.get(name)
    if info is None or info.builtin:
        return None
    if info.environment is not None:
        return list(
            info.environment
        ), f"RLCORE_PLUGIN_ENV of plugin {name!r} ({info.module.partition(':')[0]})"
    if info.distribution is None:
        return [], f"plugin {name!r}"
    return [f"{info.distribution}=={info.version}"], f"plugin {name!r} (its distribution)"


def spec_for(config: Any, name: str) -> EnvSpec:
    """The environment named ``name`` in ``config`` (its ``environments.requirements.<name>``, else the
    plugin of that name's declaration; ``environments.sites.<name>`` if any). Raises
    :class:`EnvironmentProblem` for a name that is neither."""
    defined = config.environments.requirements
    sites = tuple(os.path.abspath(os.path.expanduser(p)) for p in config.environments.sites.get(name, []))
    if name in defined:
        requirements, source = list(defined[name]), f"environments.requirements.{name}"
    else:
        found = plugin_requirements(name)
        if found is None:
            known = sorted(defined)
            raise EnvironmentProblem(
                f"environment {name!r} is neither defined under environments.requirements "
                f"({', '.join(known) if known else 'none defined'}) nor a plugin's name: define its "
                f'requirements there (environments.requirements.{name}=["transformers==5.12.1"]) or name an '
                "installed plugin (rlcore plugins lists them)"
            )
        requirements, source = found
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return EnvSpec(name, _normalise(requirements, source), base_paths(), version, sites, source)


def role_env_specs(config: Any) -> dict[str, EnvSpec]:
    """``{role: EnvSpec}`` for the roles ``environments.roles`` moves out of the driver's environment."""
    return {role: spec_for(config, name) for role, name in config.environments.roles.items()}


def role_env(config: Any, role: str) -> str | None:
    """The environment ``role``'s workers run in (``None``: the driver's)."""
    return config.environments.roles.get(role)


def config_errors(config: Any) -> list[str]:
    """What in ``environments:`` cannot run with the rest of ``config`` (placement and backend
    resolved): an unknown environment, a role in one on the local backend, a hybrid rollout apart from
    its actor."""
    errors = []
    for role, name in config.environments.roles.items():
        try:
            spec_for(config, name)
        except EnvironmentProblem as exc:
            errors.append(f"'environments.roles.{role}': {exc}")
    roles = config.environments.roles
    if roles and config.trainer.backend == "local":
        errors.append(
            f"'environments.roles' puts {', '.join(sorted(roles))} in environments of their own, whose workers "
            "need processes of their own: trainer.backend local runs every role in this process; set "
            "trainer.backend=ray (or auto)"
        )
    if config.trainer.placement == "hybrid" and role_env(config, "rollout") != role_env(config, "actor"):
        errors.append(
            f"'environments.roles': the rollout runs in {role_env(config, 'rollout') or 'the driver environment'} "
            f"and the actor in {role_env(config, 'actor') or 'the driver environment'}, but trainer.placement "
            "hybrid builds the rollout inside the actor's processes: set trainer.placement=colocated (or auto)"
        )
    return errors

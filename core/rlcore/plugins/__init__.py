"""Plugin loading: default (built-in) plugins plus entry points in the ``rlcore`` group.

Environment variables control autoloading of entry-point plugins (built-ins always load):

``RLCORE_LOAD_PLUGINS=a,b``
    load only these (entry-point or distribution names); set but empty: load none.
``RLCORE_BLOCK_PLUGINS=a,b``
    never load these.

A plugin declares the range of core API versions (:data:`rlcore.api.API_VERSION`) it supports as
``RLCORE_PLUGIN_API`` in its entry-point module (:mod:`rlcore.plugins.compat`); one whose range excludes
this rlcore's API is refused before its hooks run, with a message naming the plugin, both versions and
what to install. A plugin that fails to import, is refused, or raises inside a hook is recorded with its
real exception and the others still load; a lookup that misses quotes those failures. Every process (the
driver and each Ray worker) loads plugins on first use of :func:`registry`.

A plugin that loads but cannot work on this machine (its engine library is absent, say) may define
``plugin_status() -> str | None`` in its entry-point module: ``None`` when ready, else one line saying
what is missing and what to do, which ``rlcore plugins`` shows as the plugin's ``note``. It must stay
cheap (no engine import); an exception in it becomes the note. A note beginning ``no device:`` (a device
platform plugin on a machine without its hardware) also sets the plugin's status to ``no device``: its
names are registered, but auto-detection will not pick it here.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata as md
import os
import threading
import traceback
from typing import Any

import attrs
import pluggy

from rlcore import __version__, hookspecs
from rlcore.plugins import compat
from rlcore.plugins.registries import Registry

ENTRY_POINT_GROUP = "rlcore"
LOAD_ENV = "RLCORE_LOAD_PLUGINS"
BLOCK_ENV = "RLCORE_BLOCK_PLUGINS"

#: Built-in components, registered through the same hooks a third-party plugin implements.
DEFAULT_PLUGINS = (
    "rlcore.builtin.devices",
    "rlcore.builtin.rollout",
    "rlcore.builtin.transports",
    "rlcore.builtin.rewards",
    "rlcore.builtin.tasks",
    "rlcore.builtin.algorithms",
    "rlcore.builtin.flows",
    "rlcore.builtin.sandboxes",
    "rlcore.builtin.tools",
    "rlcore.builtin.stream_policies",
    "rlcore.testing.plugin",
)

#: hook name -> (registry key, human kind, install hint)
KINDS: dict[str, tuple[str, str, str | None]] = {
    "register_train_engines": ("train_engines", "train engine", "pip install rlcore-{name}"),
    "register_rollout_engines": ("rollout_engines", "rollout engine", "pip install rlcore-{name}"),
    "register_reward_providers": ("reward_providers", "reward provider", None),
    "register_reward_functions": ("reward_functions", "reward function", None),
    "register_algorithms": ("algorithms", "algorithm", None),
    "register_advantage_estimators": ("advantage_estimators", "advantage estimator", None),
    "register_policy_losses": ("policy_losses", "policy loss", None),
    "register_weight_transports": ("weight_transports", "weight transport", None),
    "register_device_platforms": ("device_platforms", "device platform", "pip install rlcore-{name}"),
    "register_sandboxes": ("sandboxes", "sandbox", None),
    "register_tools": ("tools", "tool", None),
    "register_stream_policies": ("stream_policies", "stream policy", None),
}


@attrs.define
class PluginInfo:
    """What ``rlcore plugins`` shows for one plugin."""

    name: str
    distribution: str | None
    version: str | None
    module: str
    status: str  # "loaded" | "no device" | "failed" | "blocked" | "not selected"
    error: str | None = None
    builtin: bool = False
    #: What a loaded plugin's ``plugin_status()`` said is missing on this machine (``None``: ready).
    note: str | None = None
    #: registry key -> names this plugin registered
    registers: dict[str, list[str]] = attrs.field(factory=dict)
    #: The core API range it declares (``">=1.0,<2"``); ``None`` for built-ins and undeclared ones.
    api_range: str | None = None
    #: The Python environment it declares for a role run apart (``RLCORE_PLUGIN_ENV``, rlcore.envs).
    environment: list[str] | None = None
    #: Its distribution's requirements and whether they hold (:func:`check_requirements`; ``None``: not
    #: checked yet, which loading alone never does: Ray workers need not pay for it).
    requirements: list[compat.RequirementStatus] | None = None

    @property
    def requirements_ok(self) -> bool | None:
        """Whether every plain (not extra) requirement holds; ``None`` if not checked."""
        if self.requirements is None:
            return None
        return all(r.ok for r in self.requirements if r.extra is None)


#: Status of a loaded device plugin whose hardware this machine lacks (see the module docstring).
NO_DEVICE = "no device"


class PluginError(RuntimeError):
    """A plugin could not be used; the message names it and says why."""


def _split_env(name: str) -> set[str] | None:
    value = os.environ.get(name)
    if value is None:
        return None
    return {part.strip() for part in value.split(",") if part.strip()}


class PluginManager:
    """Loads plugins once and owns one :class:`Registry` per hook."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager("rlcore")
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}
        self.registries: dict[str, Registry[Any]] = {
            key: Registry(kind, hint) for key, kind, hint in KINDS.values()
        }
        self._load_defaults()
        # A built-in implementing a hook nobody specified is a bug in rlcore: fail loudly.
        self.pm.check_pending()
        self._load_entry_points()
        self._collect()

    # -- loading ---------------------------------------------------------------------------------
    def _load_defaults(self) -> None:
        for module_name in DEFAULT_PLUGINS:
            module = importlib.import_module(module_name)
            self.pm.register(module, name=module_name)
            self.plugins[module_name] = PluginInfo(
                module_name, "rlcore", __version__, module_name, "loaded", builtin=True
            )

    def _load_entry_points(self) -> None:
        only, blocked = _split_env(LOAD_ENV), _split_env(BLOCK_ENV) or set()
        for ep in sorted(md.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            dist = ep.dist.name if ep.dist else None
            version = ep.dist.version if ep.dist else None
            info = PluginInfo(ep.name, dist, version, ep.value, "loaded")
            self.plugins[ep.name] = info
            names = {ep.name, dist} - {None}
            if names & blocked:
                info.status = "blocked"
                info.error = f"blocked by {BLOCK_ENV}={os.environ[BLOCK_ENV]!r}"
            elif only is not None and not names & only:
                info.status = "not selected"
                info.error = f"not listed in {LOAD_ENV}={os.environ[LOAD_ENV]!r}"
            if info.status != "loaded":
                # Installed but kept out on purpose: a lookup of its components says so, not "install it".
                for registry in self.registries.values():
                    registry.skipped_plugins[ep.name] = (dist, info.error)
                continue
            try:
                module = _load_module(ep, info)
                self.pm.register(module, name=ep.name)
                # Checked per plugin (pluggy's check_pending is global): a misspelt hook name such as
                # ``register_train_engine`` fails this plugin only, and the others still load.
                _check_hook_names(self.pm, ep.name, dist)
            except Exception as exc:
                self._fail(info, exc)
                continue
            info.note = _status_note(module)
            if info.note and info.note.startswith(NO_DEVICE + ":"):
                info.status = NO_DEVICE

    def _fail(self, info: PluginInfo, exc: BaseException) -> None:
        """Record ``exc`` for ``info`` and take back everything the plugin registered."""
        info.status = "failed"
        if isinstance(exc, compat.IncompatiblePlugin):
            # The refusal is the news; an import failure it explains follows it, traceback and all.
            info.error = f"{type(exc).__name__}: {exc}"
            if exc.__cause__ is not None:
                cause = "".join(traceback.format_exception(exc.__cause__)).rstrip()
                info.error += f"\nIts import failed too, probably for that reason:\n{cause}"
        else:
            info.error = "".join(traceback.format_exception(exc)).rstrip()
        info.registers = {}
        if self.pm.has_plugin(info.name):
            self.pm.unregister(name=info.name)
        for registry in self.registries.values():
            registry.failed_plugins[info.name] = _one_line(exc)
            registry.remove_plugin(info.name)

    def _collect(self) -> None:
        """Call every hook implementation, one plugin at a time, so registrations carry their plugin.

        A plugin whose hook raises (a name registered twice included) is failed as a whole: what it
        registered in earlier hooks is removed, so a half-loaded plugin never serves components.
        """
        for hook_name, (key, _kind, _hint) in KINDS.items():
            registry = self.registries[key]
            for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                info = self.plugins[impl.plugin_name]
                if info.status == "failed":
                    continue
                try:
                    impl.function(register=registry.registrar(impl.plugin_name))
                except Exception as exc:
                    if info.builtin:
                        raise
                    self._fail(info, exc)
        for key, registry in self.registries.items():
            for entry in registry.entries():
                self.plugins[entry.plugin].registers.setdefault(key, []).append(entry.name)


def _one_line(exc: BaseException) -> str:
    """``Type: message`` plus where a plugin's own code raised it (what a lookup miss quotes)."""
    text = " ".join(traceback.format_exception_only(exc)).strip().replace("\n", " ")
    frames = traceback.extract_tb(exc.__traceback__)
    if frames and not isinstance(exc, (PluginError, compat.IncompatiblePlugin)):
        text += f" ({frames[-1].filename}, line {frames[-1].lineno})"
    return text


def _status_note(module: Any) -> str | None:
    """The plugin's own ``plugin_status()`` (see the module docstring), or ``None`` if it has none."""
    status = getattr(module, "plugin_status", None)
    if not callable(status):
        return None
    try:
        note = status()
    except Exception as exc:
        return f"plugin_status() raised {type(exc).__name__}: {exc}"
    return str(note) if note else None


def _check_hook_names(pm: pluggy.PluginManager, name: str, dist: str | None) -> None:
    """Raise :class:`PluginError` if plugin ``name`` implements a hook that :mod:`rlcore.hookspecs` lacks."""
    known = sorted(KINDS)
    for caller in pm.get_hookcallers(pm.get_plugin(name)) or []:
        if caller.has_spec():
            continue
        if all(impl.optionalhook for impl in caller.get_hookimpls() if impl.plugin_name == name):
            continue
        close = difflib.get_close_matches(caller.name, known, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise PluginError(
            f"plugin {name!r} ({dist or 'unknown distribution'}) implements {caller.name!r}, which is not an "
            f"rlcore hook.{hint} Hooks: {', '.join(known)}."
        )


def _load_module(ep: Any, info: PluginInfo) -> Any:
    """Import ``ep``'s module and check its declared API range (:func:`compat.check_api_range`).

    When the import itself fails, the range written in the module's source is still read: a plugin built
    for another API usually fails on an import of a name that API lacks, and the refusal then comes
    first, with the traceback under it."""
    try:
        module = ep.load()
    except Exception as exc:
        declared = compat.declared_in_source(ep.value.split(":")[0])
        if declared is not None:
            try:
                compat.check_api_range(info.name, info.distribution, info.version, declared, ep.value)
            except compat.IncompatiblePlugin as refusal:
                raise refusal from exc
        raise
    info.api_range = compat.check_api_range(
        info.name,
        info.distribution,
        info.version,
        getattr(module, compat.API_ATTRIBUTE, None),
        module.__name__,
    )
    declared_env = getattr(module, compat.ENV_ATTRIBUTE, None)
    info.environment = [str(r) for r in declared_env] if declared_env is not None else None
    return module


def check_requirements(infos: list[PluginInfo] | None = None) -> list[PluginInfo]:
    """Fill each entry-point plugin's :attr:`PluginInfo.requirements` from its distribution's metadata
    (all of the manager's plugins by default; not the blocked or not selected ones); return the infos."""
    infos = list(get_plugin_manager().plugins.values()) if infos is None else infos
    for info in infos:
        # Blocked and not-selected plugins are out on purpose: what they would need is beside the point.
        kept_out = info.status in ("blocked", "not selected")
        if not info.builtin and not kept_out and info.distribution and info.requirements is None:
            info.requirements = compat.requirement_status(info.distribution)
    return infos


_manager: PluginManager | None = None
_lock = threading.Lock()


def get_plugin_manager() -> PluginManager:
    """The process-wide plugin manager, created (and plugins loaded) on first use."""
    global _manager
    with _lock:
        if _manager is None:
            _manager = PluginManager()
        return _manager


def reset_plugins() -> None:
    """Forget loaded plugins (tests change environment variables, then reload)."""
    global _manager
    with _lock:
        _manager = None


def registry(key: str) -> Registry[Any]:
    """The registry for ``key`` (``"train_engines"``, ``"rollout_engines"``, ... see :data:`KINDS`)."""
    return get_plugin_manager().registries[key]

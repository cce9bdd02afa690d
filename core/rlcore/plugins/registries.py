"""Name -> component registries filled by plugin hooks.

A registry never silently replaces an entry: registering a taken name is an error naming both plugins.
Looking up an unknown name lists what is installed and, for engines, which distribution would provide it.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import attrs

T = TypeVar("T")


class RegistryError(LookupError):
    """A registry lookup or registration failed; the message says what to do."""


@attrs.define
class Entry(Generic[T]):
    """One registered component. ``target`` may be a lazy ``"module:attr"`` string."""

    name: str
    target: Any
    plugin: str
    options: dict[str, Any] = attrs.field(factory=dict)

    @property
    def label(self) -> str:
        """``'name' (plugin 'plugin')``: how messages name a component, so a user knows which package it
        came from."""
        return f"{self.name!r} (plugin {self.plugin!r})"

    def load(self) -> T:
        """Return the component, importing it first if it was registered lazily."""
        if isinstance(self.target, str):
            module_name, _, attr = self.target.partition(":")
            try:
                module = importlib.import_module(module_name)
                self.target = getattr(module, attr) if attr else module
            except Exception as exc:
                raise RegistryError(
                    f"{self.name!r} (from plugin {self.plugin!r}) could not be imported from "
                    f"{self.target!r}: {type(exc).__name__}: {exc}"
                ) from exc
        return self.target


class Registry(Generic[T]):
    """Components of one kind (``kind`` is a human name like ``"train engine"``).

    ``install_hint`` formats a name into advice for a missing component, e.g.
    ``"pip install rlcore-{name}"``.
    """

    def __init__(self, kind: str, install_hint: str | None = None):
        self.kind = kind
        self.install_hint = install_hint
        self._entries: dict[str, Entry[T]] = {}
        #: plugin name -> one-line error (exception and where it was raised), for plugins that failed to
        #: load; quoted when a lookup misses. ``rlcore plugins`` shows the full tracebacks.
        self.failed_plugins: dict[str, str] = {}
        #: plugin name -> (distribution, why it was not loaded), for installed plugins that
        #: ``RLCORE_BLOCK_PLUGINS`` / ``RLCORE_LOAD_PLUGINS`` kept out; quoted when a lookup misses.
        self.skipped_plugins: dict[str, tuple[str | None, str]] = {}

    def register(self, name: str, target: Any, *, plugin: str = "<direct>", **options: Any) -> None:
        if not isinstance(name, str) or not name:
            raise RegistryError(f"{self.kind} names must be non-empty strings, got {name!r} from {plugin!r}")
        if name in self._entries:
            other = self._entries[name].plugin
            raise RegistryError(
                f"{self.kind} {name!r} is registered twice: by plugin {other!r} and by plugin {plugin!r}. "
                f"Rename one of them, or block one plugin with RLCORE_BLOCK_PLUGINS."
            )
        self._entries[name] = Entry(name, target, plugin, dict(options))

    def registrar(self, plugin: str) -> Callable[..., None]:
        """The ``register`` callable handed to one plugin's hook implementation."""

        def register(name: str, target: Any, **options: Any) -> None:
            self.register(name, target, plugin=plugin, **options)

        return register

    def remove_plugin(self, plugin: str) -> list[str]:
        """Forget every entry ``plugin`` registered (it failed after registering some); return their names."""
        names = [name for name, entry in self._entries.items() if entry.plugin == plugin]
        for name in names:
            del self._entries[name]
        return names

    def entry(self, name: str) -> Entry[T]:
        try:
            return self._entries[name]
        except KeyError:
            raise RegistryError(self._unknown_message(name)) from None

    def get(self, name: str) -> T:
        """The component registered as ``name``, imported if lazy."""
        return self.entry(name).load()

    def _unknown_message(self, name: str) -> str:
        known = sorted(self._entries)
        lines = [f"unknown {self.kind} {name!r}. Installed: {', '.join(known) if known else '(none)'}."]
        close = self.closest(name)
        if close:
            lines.append(f"Did you mean {close!r}?")
        lines.extend(self.missing_advice(name, close))
        return "\n".join(lines)

    def closest(self, name: str) -> str | None:
        """The registered name most like ``name`` (likely what a typo meant), or ``None``."""
        close = difflib.get_close_matches(name, sorted(self._entries), n=1)
        return close[0] if close else None

    def missing_advice(self, name: str, close: str | None) -> list[str]:
        """Lines saying why ``name`` may be missing and what to do (``close``: the suggested name, if any).

        Also used by config validation (:mod:`rlcore.config.names`), which words the first line itself.
        """
        lines = []
        # A failed plugin named like the component is the answer; otherwise any failure may be.
        related = {p: e for p, e in self.failed_plugins.items() if name in p or p in name}
        quoted = related or ({} if close else self.failed_plugins)
        for plugin, error in quoted.items():
            why = "which is why" if plugin in related else "which may be why"
            lines.append(f"Plugin {plugin!r} is installed but failed to load, {why}:\n  {error}")
        if quoted:
            lines.append("`rlcore plugins` shows the full traceback of each failed plugin.")
        skipped = {
            p: (dist, why)
            for p, (dist, why) in self.skipped_plugins.items()
            if name in p or p in name or (dist and name in dist)
        }
        for plugin, (dist, why) in skipped.items():
            package = f" (distribution {dist!r})" if dist else ""
            lines.append(
                f"Plugin {plugin!r}{package} is installed but not loaded: {why}. Change that variable to load it."
            )
        if self.install_hint and not close and not related and not skipped:
            lines.append("If it is published as a plugin, install it: " + self.install_hint.format(name=name))
        return lines

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> Iterator[Entry[T]]:
        return iter(self._entries.values())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"

"""What a plugin declares it needs, and whether this environment gives it.

Two declarations, each kept where its tool already looks for it:

- the **core API range**: ``RLCORE_PLUGIN_API`` in the entry-point module, a PEP 440 range of
  :data:`rlcore.api.API_VERSION` (``">=1.0,<2"``; an integer ``N`` means ``">=N.0,<N+1"``). A plugin
  whose range excludes this rlcore's API is refused before its hooks are called.
- the **requirements**: the distribution's own ``Requires-Dist`` metadata (``dependencies`` and
  ``optional-dependencies`` in its ``pyproject.toml``), read with :func:`importlib.metadata.requires` and
  checked with ``packaging`` against what is installed. They are reported, not enforced: pip installed
  the plugin with them, so a miss means the environment changed since (another package's pin, say), and
  ``rlcore plugins`` says which one and what to install.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import importlib.util
import sys
from typing import Any

import attrs
from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from rlcore.api import API_VERSION

#: The module attribute a plugin declares its supported core API range in.
API_ATTRIBUTE = "RLCORE_PLUGIN_API"
#: The module attribute a plugin declares the requirements of its own Python environment in
#: (``["rlcore-sglang[cuda]"]``; ``rlcore env build NAME``, rlcore.envs).
ENV_ATTRIBUTE = "RLCORE_PLUGIN_ENV"
#: What ``rlcore new-plugin`` writes and the in-tree plugins declare: every minor of this major.
DEFAULT_RANGE = f">={Version(API_VERSION).major}.0,<{Version(API_VERSION).major + 1}"


class IncompatiblePlugin(RuntimeError):
    """A plugin's declared API range excludes this rlcore's, or is not a range; the message says what to
    install."""


def pip_command(*args: str) -> str:
    """``pip install ...`` for the interpreter running rlcore: a bare ``pip`` may belong to another Python."""
    return " ".join([sys.executable, "-m", "pip", "install", *args])


def parse_range(declared: Any, where: str) -> SpecifierSet:
    """The :class:`SpecifierSet` a plugin's ``RLCORE_PLUGIN_API`` value stands for; ``where`` names the
    plugin in the error."""
    example = f"`{API_ATTRIBUTE} = {DEFAULT_RANGE!r}`"
    if isinstance(declared, int) and not isinstance(declared, bool):
        return SpecifierSet(f">={declared}.0,<{declared + 1}")
    if not isinstance(declared, str):
        raise IncompatiblePlugin(
            f"{where} sets {API_ATTRIBUTE} = {declared!r}; it must be a version range of the rlcore plugin "
            f"API such as {example} (this rlcore provides API {API_VERSION})."
        )
    try:
        spec = SpecifierSet(declared)
    except InvalidSpecifier:
        raise IncompatiblePlugin(
            f"{where} sets {API_ATTRIBUTE} = {declared!r}, which is not a version range; write one such as "
            f"{example} (this rlcore provides API {API_VERSION})."
        ) from None
    if not str(spec):
        raise IncompatiblePlugin(
            f"{where} sets {API_ATTRIBUTE} = '' (any version); declare a range: {example}."
        )
    return spec


def _lowest(spec: SpecifierSet) -> Version | None:
    """The highest lower bound in ``spec`` (``>=``, ``>``, ``==``, ``~=``), or ``None`` if it has none."""
    bounds = [Version(s.version.rstrip(".*")) for s in spec if s.operator in (">=", ">", "==", "~=", "===")]
    return max(bounds) if bounds else None


def check_api_range(name: str, dist: str | None, version: str | None, declared: Any, module: str) -> str:
    """Raise :class:`IncompatiblePlugin` unless ``declared`` (a plugin's ``RLCORE_PLUGIN_API``) admits
    :data:`API_VERSION`; return the range as text (``">=1.0,<2"``)."""
    import rlcore

    label = " ".join(p for p in (dist or "unknown distribution", version) if p)
    where = f"plugin {name!r} ({label}, module {module})"
    if declared is None:
        raise IncompatiblePlugin(
            f"{where} does not declare {API_ATTRIBUTE}, the range of rlcore plugin API versions it supports. "
            f"Add `{API_ATTRIBUTE} = {DEFAULT_RANGE!r}` to {module} once it works with rlcore "
            f"{rlcore.__version__} (API {API_VERSION})."
        )
    spec = parse_range(declared, where)
    # As the plugin wrote it (SpecifierSet's own str() sorts the clauses: "<2,>=1.0").
    text = declared.strip() if isinstance(declared, str) else f">={declared}.0,<{declared + 1}"
    if spec.contains(API_VERSION, prereleases=True):
        return text
    ours = Version(API_VERSION)
    low = _lowest(spec)
    package = dist or name
    if low is not None and low > ours:
        fix = (
            f"The plugin is newer than this rlcore: upgrade rlcore to one that provides an API in {text} "
            f"(`{pip_command('-U', 'rlcore')}`), or install a release of {package} that supports API "
            f"{API_VERSION}."
        )
    else:
        fix = (
            f"The plugin was built for an older API: upgrade it (`{pip_command('-U', package)}`) to a "
            f"release that supports API {API_VERSION}, or install an rlcore that provides an API in {text}."
        )
    raise IncompatiblePlugin(
        f"{where} supports rlcore plugin API {text}, but rlcore {rlcore.__version__} provides API "
        f"{API_VERSION}, so it was not loaded. {fix}"
    )


def declared_in_source(module: str) -> Any:
    """``RLCORE_PLUGIN_API`` as written in ``module``'s source, read without running it (``None`` if it
    cannot be read). Used when the import failed: a plugin built for another API often fails on an
    import of a name that API does not have, and its declaration then explains the traceback."""
    try:
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return None
        with open(spec.origin, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except Exception:  # a parent package that fails to import, unreadable source: nothing to add
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == API_ATTRIBUTE for t in node.targets
        ):
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return None
    return None


@attrs.define
class RequirementStatus:
    """One line of a distribution's ``Requires-Dist`` and what this environment has of it."""

    requirement: str
    #: The extra that asks for it (``pip install rlcore-vllm[cpu]``); ``None`` for a plain dependency.
    extra: str | None
    #: Installed version of the project, ``None`` if absent.
    installed: str | None
    ok: bool


def requirement_status(dist: str) -> list[RequirementStatus]:
    """Every requirement of distribution ``dist`` that applies to this platform, with whether it holds
    (empty if ``dist`` is not installed or declares none)."""
    try:
        lines = md.requires(dist) or []
    except md.PackageNotFoundError:
        return []
    env = default_environment()
    found: list[RequirementStatus] = []
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            found.append(RequirementStatus(line, None, None, False))
            continue
        extra = None
        if req.marker is not None:
            if not req.marker.evaluate({**env, "extra": ""}):
                # Asked for by an extra, or not for this platform: find which extra, if any.
                extra = next(
                    (
                        e
                        for e in md.metadata(dist).get_all("Provides-Extra") or []
                        if req.marker.evaluate({**env, "extra": e})
                    ),
                    None,
                )
                if extra is None:
                    continue  # a platform marker that excludes this machine
        try:
            installed: str | None = md.version(req.name)
        except md.PackageNotFoundError:
            installed = None
        ok = installed is not None and req.specifier.contains(installed, prereleases=True)
        text = str(Requirement(line)).split(";")[0].strip()
        found.append(RequirementStatus(text, extra, installed, ok))
    return found

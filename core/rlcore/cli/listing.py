"""The text of ``rlcore plugins``: one block per plugin, names wrapped to the terminal's width.

A table with a column of registered names does not fit 80 columns (the built-ins register dozens), so
each plugin gets a heading line and one indented line per kind of component:

    fsdp (rlcore-fsdp 0.1.0): loaded
      train engines          fsdp

An entry-point plugin also gets its declared core API range and its distribution's requirements, each
with what is installed; a requirement that does not hold is marked ``NOT MET`` and a ``to fix`` line gives
the install command for the interpreter running rlcore. A plugin that loaded but cannot work here
(``plugin_status()``, see :mod:`rlcore.plugins`) gets a ``note`` line saying what is missing.

    fsdp (rlcore-fsdp 0.1.0): loaded
      train engines          fsdp
      api                    >=1.0,<2 (rlcore provides 1.0)
      requires               rlcore>=0.1,<0.2 (0.1.0), torch>=2.11 (2.13.0+cpu), ...
      extra lora             peft>=0.17 (0.18.0)
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable

from rlcore.api import API_VERSION
from rlcore.plugins import PluginInfo
from rlcore.plugins.compat import RequirementStatus, pip_command

#: Width of the kind column ("advantage estimators" is the longest kind).
KIND_WIDTH = 22


def format_plugins(infos: Iterable[PluginInfo], width: int = 80) -> str:
    """Every plugin's block, built-ins first as they were loaded, with a failed plugin's error under it."""
    lines: list[str] = []
    for info in infos:
        origin = " ".join(p for p in (info.distribution, info.version) if p)
        name = info.name.removeprefix("rlcore.builtin.") + (" [built in]" if info.builtin else "")
        status = info.status
        unmet = [r for r in info.requirements or [] if r.extra is None and not r.ok]
        if unmet:
            status += f", {len(unmet)} requirement{'s' if len(unmet) > 1 else ''} not met"
        lines.append(f"{name} ({origin}): {status}" if origin else f"{name}: {status}")
        for kind, names in info.registers.items():
            lines.extend(_field(kind.replace("_", " "), ", ".join(names), width))
        if info.api_range:
            lines.extend(_field("api", f"{info.api_range} (rlcore provides {API_VERSION})", width))
        plain = [r for r in info.requirements or [] if r.extra is None]
        if plain:
            lines.extend(_field("requires", ", ".join(_requirement(r) for r in plain), width))
        extras: dict[str, list[RequirementStatus]] = {}
        for r in info.requirements or []:
            if r.extra is not None:
                extras.setdefault(r.extra, []).append(r)
        for extra, reqs in extras.items():
            lines.extend(
                _field(f"extra {extra}", ", ".join(_requirement(r, optional=True) for r in reqs), width)
            )
        if info.environment is not None:
            built = f"{', '.join(info.environment)} (rlcore env build {info.name})"
            lines.extend(_field("environment", built, width))
        if unmet:
            lines.extend(_field("to fix", pip_command(*(f"'{r.requirement}'" for r in unmet)), width))
        if info.note:
            lines.extend(_field("note", info.note, width))
        if info.error and info.status == "failed":
            for line in info.error.strip().splitlines():
                lines.extend(
                    # Every wrapped piece keeps the marker: a reader (or grep) sees which lines are the error.
                    textwrap.wrap(line, width=max(width, 40), initial_indent="  ! ", subsequent_indent="  ! ")
                )
    return "\n".join(lines)


def _field(label: str, text: str, width: int) -> list[str]:
    """``text`` under an indented ``label`` column, wrapped to ``width`` (names are never split)."""
    head = f"  {label:<{KIND_WIDTH}} "
    return textwrap.wrap(
        text,
        width=max(width, 40),
        initial_indent=head,
        subsequent_indent=" " * len(head),
        break_on_hyphens=False,
        break_long_words=False,
    )


def _requirement(r: RequirementStatus, optional: bool = False) -> str:
    """``torch>=2.6 (2.7.1)``; one that does not hold says so (an extra's absent package is no fault)."""
    if r.ok:
        return f"{r.requirement} ({r.installed})"
    if r.installed is None:
        return f"{r.requirement} ({'not installed' if optional else 'NOT MET: not installed'})"
    return f"{r.requirement} (NOT MET: {r.installed} installed)"

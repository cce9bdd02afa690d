"""The text of ``rlcore plugins``: one block per plugin, names wrapped to the terminal's width.

A table with a column of registered names does not fit 80 columns (the built-ins register dozens), so
each plugin gets a heading line and one indented line per kind of component:

    fsdp (rlcore-fsdp 0.1.0): loaded
      train engines          fsdp

A plugin that loaded but cannot work here (``plugin_status()``, see :mod:`rlcore.plugins`) gets a
``note`` line saying what is missing.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable

from rlcore.plugins import PluginInfo

#: Width of the kind column ("advantage estimators" is the longest kind).
KIND_WIDTH = 22


def format_plugins(infos: Iterable[PluginInfo], width: int = 80) -> str:
    """Every plugin's block, built-ins first as they were loaded, with a failed plugin's error under it."""
    lines: list[str] = []
    for info in infos:
        origin = " ".join(p for p in (info.distribution, info.version) if p)
        name = info.name.removeprefix("rlcore.builtin.") + (" [built in]" if info.builtin else "")
        lines.append(f"{name} ({origin}): {info.status}" if origin else f"{name}: {info.status}")
        for kind, names in info.registers.items():
            label = f"  {kind.replace('_', ' '):<{KIND_WIDTH}} "
            lines.extend(
                textwrap.wrap(
                    ", ".join(names),
                    width=max(width, 40),
                    initial_indent=label,
                    subsequent_indent=" " * len(label),
                    break_on_hyphens=False,
                )
            )
        if info.note:
            label = f"  {'note':<{KIND_WIDTH}} "
            lines.extend(
                textwrap.wrap(
                    info.note, width=max(width, 40), initial_indent=label, subsequent_indent=" " * len(label)
                )
            )
        if info.error and info.status == "failed":
            for line in info.error.strip().splitlines():
                lines.extend(
                    # Every wrapped piece keeps the marker: a reader (or grep) sees which lines are the error.
                    textwrap.wrap(line, width=max(width, 40), initial_indent="  ! ", subsequent_indent="  ! ")
                )
    return "\n".join(lines)

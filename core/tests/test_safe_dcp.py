"""``rlcore.safe_dcp``: DCP checkpoints read as data; a planted pickle is refused and never run."""

from __future__ import annotations

import dataclasses
import io
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp
from rlcore.safe_dcp import (
    SafeFileSystemReader,
    SafeLoadPlanner,
    UnsafeCheckpointError,
    check_folder,
)
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

# dcp.save / dcp.load without a process group (no_dist=True) still say so.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class Planted:
    """Unpickling this creates ``marker``: a stand-in for a payload that runs arbitrary code."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def fresh_state() -> dict:
    return {"w": torch.zeros(2, 3), "optim": {"lr": 0.0, "betas": (0.0, 0.0)}, "step": 0}


@pytest.fixture
def folder(tmp_path):
    """A DCP checkpoint with tensors and non-tensor ("bytes") items, written without a process group."""
    saved = {"w": torch.arange(6.0).reshape(2, 3), "optim": {"lr": 0.1, "betas": (0.9, 0.99)}, "step": 3}
    dcp.save(saved, checkpoint_id=str(tmp_path / "ckpt"), no_dist=True)
    return tmp_path / "ckpt"


def safe_load(folder, state: dict) -> None:
    dcp.load(state, storage_reader=SafeFileSystemReader(folder), planner=SafeLoadPlanner(), no_dist=True)


def failures(refused: CheckpointException) -> str:
    """What each rank reported: dcp.load wraps its readers' and planners' errors in one exception."""
    return "\n".join(str(exc) for exc, _ in refused.failures.values())


def plant_in_a_byte_item(folder, payload: bytes) -> str:
    """Point one non-tensor item of ``folder`` at ``payload`` (appended to its data file)."""
    metadata = pickle.loads((folder / ".metadata").read_bytes())  # the test's own file: trusted
    key = next(k for k in metadata.storage_data if k.fqn == "step")
    assert isinstance(metadata.state_dict_metadata[key.fqn], BytesStorageMetadata)
    info = metadata.storage_data[key]
    data_file = folder / info.relative_path
    offset = data_file.stat().st_size
    with open(data_file, "ab") as f:
        f.write(payload)
    metadata.storage_data[key] = dataclasses.replace(info, offset=offset, length=len(payload))
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    return str(data_file)


def test_a_checkpoint_loads_through_the_safe_reader_and_planner(folder):
    check_folder(folder)
    state = fresh_state()
    safe_load(folder, state)
    assert torch.equal(state["w"], torch.arange(6.0).reshape(2, 3))
    assert state["optim"] == {"lr": 0.1, "betas": (0.9, 0.99)} and state["step"] == 3


def test_a_planted_index_is_refused_and_never_run(folder, tmp_path):
    marker = tmp_path / "pwned"
    (folder / ".metadata").write_bytes(pickle.dumps(Planted(marker)))
    with pytest.raises(
        UnsafeCheckpointError, match=r"it names io\.open, which a DCP index does not hold"
    ) as err:
        check_folder(folder)
    assert str(folder / ".metadata") in str(err.value) and "resume from another checkpoint" in str(err.value)
    with pytest.raises(CheckpointException) as inside_dcp:
        safe_load(folder, fresh_state())
    assert "refusing to load" in failures(inside_dcp.value)
    assert not marker.exists()
    # DCP's own reader would have run it.
    with pytest.raises(CheckpointException):  # what fails after the payload ran does not matter
        dcp.load(fresh_state(), checkpoint_id=str(folder), no_dist=True)
    assert marker.exists()


def test_a_planted_byte_item_is_refused_and_never_run(folder, tmp_path):
    marker = tmp_path / "pwned"
    payload = io.BytesIO()
    torch.save(Planted(marker), payload)
    data_file = plant_in_a_byte_item(folder, payload.getvalue())
    with pytest.raises(UnsafeCheckpointError, match="weights_only=True") as err:
        check_folder(folder)
    assert f"item 'step' of {data_file}" in str(err.value)
    with pytest.raises(CheckpointException) as inside_dcp:
        safe_load(folder, fresh_state())  # the planner alone refuses it too
    assert "refusing to load checkpoint item 'step'" in failures(inside_dcp.value)
    assert not marker.exists()
    # DCP's default planner would have run it (torch.load(weights_only=False)).
    dcp.load(fresh_state(), checkpoint_id=str(folder), no_dist=True)
    assert marker.exists()


def test_a_file_that_is_not_an_index_is_refused(folder):
    (folder / ".metadata").write_bytes(b"not a pickle")
    with pytest.raises(UnsafeCheckpointError, match="it is not a DCP index"):
        check_folder(folder)


class _EnumsByGetattr(pickle.Pickler):
    """Pickles enum members as ``getattr(EnumClass, name)``, as Debian's Python 3.11.2 does."""

    def reducer_override(self, obj):
        import enum

        if isinstance(obj, enum.Enum):
            return getattr, (type(obj), obj.name)
        return NotImplemented


def test_an_index_with_enum_members_by_getattr_loads(folder):
    """The index of a checkpoint written on Python 3.11.2 names ``builtins.getattr`` for its enums (CI
    failed on it): member lookups on admitted enums load; any other getattr call is refused, not made."""
    from rlcore.safe_dcp import load_metadata

    metadata = check_folder(folder)
    buffer = io.BytesIO()
    _EnumsByGetattr(buffer).dump(metadata)
    assert b"getattr" in buffer.getvalue()  # the index does hold enum members
    loaded = load_metadata(io.BytesIO(buffer.getvalue()), "index")
    assert loaded.state_dict_metadata == metadata.state_dict_metadata

    # getattr(torch.Size, "__new__"): an admitted class, but not an enum member lookup.
    forged = b"\x80\x04cbuiltins\ngetattr\nctorch\nSize\nX\x07\x00\x00\x00__new__\x86R."
    with pytest.raises(UnsafeCheckpointError, match="not an enum member lookup"):
        load_metadata(io.BytesIO(forged), "index")

"""``load_sharded`` reads a checkpoint as data: a planted pickle is refused, naming the file, and never run.

(The engines' own round trips through ``save_checkpoint``/``load_checkpoint`` are in test_engine_heads.py
and test_engine_distributed.py.)
"""

from __future__ import annotations

import dataclasses
import io
import pickle

import pytest
import torch
from rlcore.safe_dcp import UnsafeCheckpointError
from rlcore_fsdp.checkpoint import load_sharded, save_sharded

# DCP without a process group says so on every save and load.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class Planted:
    """Unpickling this creates ``marker``: a stand-in for a payload that runs arbitrary code."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def state(step: int, lr: float, weight: torch.Tensor) -> dict:
    """Shaped as FSDPEngine._checkpoint_state: tensors, and plain values DCP stores as pickled bytes."""
    return {
        "model": {"w": weight},
        "optim": {"param_groups": [{"lr": lr, "betas": (0.9, 0.99), "params": ["w"]}]},
        "trainer": {"step": step},
    }


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "ckpt"
    save_sharded(state(3, 0.1, torch.arange(4.0)), str(path), {"step": 3})
    return path


def test_load_sharded_restores_tensors_and_plain_values(checkpoint):
    loaded = state(0, 0.0, torch.zeros(4))
    assert load_sharded(loaded, str(checkpoint)) == {"step": 3}
    assert loaded["optim"] == {"param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": ["w"]}]}
    assert loaded["trainer"] == {"step": 3}
    assert torch.equal(loaded["model"]["w"], torch.arange(4.0))


def plant_in_the_step(path, payload: bytes) -> str:
    """Point the checkpoint's ``trainer.step`` item at ``payload`` (appended to its data file)."""
    metadata = pickle.loads((path / ".metadata").read_bytes())  # the test's own file: trusted
    key = next(k for k in metadata.storage_data if k.fqn == "trainer.step")
    info = metadata.storage_data[key]
    data_file = path / info.relative_path
    offset = data_file.stat().st_size
    with open(data_file, "ab") as f:
        f.write(payload)
    metadata.storage_data[key] = dataclasses.replace(info, offset=offset, length=len(payload))
    (path / ".metadata").write_bytes(pickle.dumps(metadata))
    return str(data_file)


@pytest.mark.parametrize("where", ["index", "value"])
def test_load_sharded_refuses_a_planted_pickle_and_never_runs_it(checkpoint, tmp_path, where):
    marker = tmp_path / "pwned"
    if where == "index":
        (checkpoint / ".metadata").write_bytes(pickle.dumps(Planted(marker)))
        named = str(checkpoint / ".metadata")
    else:
        payload = io.BytesIO()
        torch.save(Planted(marker), payload)
        named = f"item 'trainer.step' of {plant_in_the_step(checkpoint, payload.getvalue())}"
    with pytest.raises(UnsafeCheckpointError) as refused:
        load_sharded(state(0, 0.0, torch.zeros(4)), str(checkpoint))
    assert f"refusing to load {named}:" in str(refused.value)
    assert "resume from another checkpoint" in str(refused.value)
    assert not marker.exists()

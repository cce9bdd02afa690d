"""``rlcore export``: a run's checkpoint as a Hugging Face model folder.

The role's engine is rebuilt in this process with world size 1 from the config the run saved (each
checkpoint holds a copy), loads the checkpoint, and writes the folder with ``export_hf``; transformers
and vLLM load the result. Engines whose checkpoints are sharded by rank (FSDP's DCP) re-shard on load.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs

from rlcore.config.specs import engine_section, engine_spec
from rlcore.trainer.checkpoint import CONFIG_FILE, TRAINED_ROLES, CheckpointError, resolve_checkpoint


def export_checkpoint(
    checkpoint_dir: str | os.PathLike, out_dir: str | os.PathLike, role: str = "actor", device: str = "auto"
) -> Path:
    """Write role ``role`` of ``checkpoint_dir`` (a ``step_N`` folder, the run's ``checkpoints/`` folder or
    the run directory: its latest checkpoint) to ``out_dir`` as a Hugging Face model folder."""
    from rlcore.cluster.workers import TrainWorker
    from rlcore.config import load_config

    if role not in TRAINED_ROLES:
        raise ValueError(f"role {role!r} is not checkpointed; export one of {', '.join(TRAINED_ROLES)}")
    path = resolve_checkpoint(checkpoint_dir)
    if not (path / role).exists():
        have = sorted(p.name for p in path.iterdir() if p.is_dir())
        raise CheckpointError(f"checkpoint {path} has no {role!r} role; it holds {have}")
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        config_file = path.parent.parent / CONFIG_FILE  # the run directory's copy
    if not config_file.is_file():
        raise FileNotFoundError(f"no {CONFIG_FILE} in {path} or its run directory; cannot rebuild the engine")
    config = load_config(config_file)
    # One process, one rank: the engine loads the whole checkpoint whatever world size wrote it.
    config = attrs.evolve(config, actor=attrs.evolve(config.actor, world_size=1))
    spec = engine_spec(config, role)
    worker = TrainWorker(
        role, config.engine, spec, engine_section(config, "train_engines", config.engine), device=device
    )
    try:
        worker.load_checkpoint(str(path / role))
        worker.export_hf(str(out_dir))
    finally:
        worker.shutdown()
    return Path(out_dir)

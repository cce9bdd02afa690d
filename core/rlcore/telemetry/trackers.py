"""The experiment trackers among the metric sinks (``trainer.loggers``): Weights & Biases and MLflow.

Both packages are optional. Each is imported only when a run asks for its tracker, and a run asking for
one that cannot work fails before any engine starts, saying what to install or set
(:func:`check_tracker`). The metrics are those of ``metrics.jsonl``, at the same steps.

W&B: project ``$WANDB_PROJECT`` (default ``rlcore``), display name the run directory's name, files under
``<run dir>/wandb`` (``WANDB_MODE=offline`` keeps everything there; ``wandb sync`` uploads it later).
A fresh run gets a new W&B run id, remembered in ``<run dir>/wandb/rlcore-run-id``; a run that resumes
from a checkpoint continues that W&B run. W&B ignores steps it already has: for those a killed run
logged after its last checkpoint it keeps the killed run's values, where ``metrics.jsonl`` has the
resumed run's.

MLflow: experiment ``$MLFLOW_EXPERIMENT_NAME`` (default ``rlcore``) in MLflow's tracking store
(``$MLFLOW_TRACKING_URI``, or MLflow's default), one MLflow run per process named as the run directory
(a resumed run starts another MLflow run of that name), the config as flattened params. Metric names
are those of ``metrics.jsonl`` with any character MLflow rejects as ``_``; in a local ``file:`` store
``/`` becomes ``.`` (see :func:`mlflow_name`).
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

logger = logging.getLogger(__name__)

TRACKERS = ("wandb", "mlflow")
_INSTALL = {"wandb": "pip install wandb", "mlflow": "pip install mlflow"}
#: Where a fresh run stores its W&B run id, so that a resume continues the same W&B run.
WANDB_ID_FILE = Path("wandb") / "rlcore-run-id"


def check_tracker(name: str) -> None:
    """Fail now, before any engine starts, if the tracker ``name`` would fail when the run logs."""
    import importlib.util

    if importlib.util.find_spec(name) is None:
        raise ValueError(
            f"trainer.loggers includes {name!r} but the {name} package is not installed: "
            f"{_INSTALL[name]}, or remove it from trainer.loggers"
        )
    if name == "mlflow":
        _check_mlflow_store()


def _check_mlflow_store() -> None:
    # MLflow opens its store when the first client is made. Its default store is sqlite:///mlflow.db,
    # which mlflow-skinny cannot open, and a file: store refuses to open unless
    # MLFLOW_ALLOW_FILE_STORE=true (MLflow 3.17): say so now, not after minutes of engine start-up.
    import mlflow

    uri = mlflow.get_tracking_uri()
    try:
        mlflow.tracking.MlflowClient(uri)
    except Exception as exc:
        where = "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "MLflow's default"
        raise ValueError(
            f"trainer.loggers includes 'mlflow' but MLflow cannot open its tracking store {uri!r} "
            f"({where}): {exc}\nSet MLFLOW_TRACKING_URI to a tracking server (http://host:5000) or a local "
            "store: sqlite:///mlflow.db (needs the full mlflow package; mlflow-skinny alone cannot), or "
            "file:<folder> with MLFLOW_ALLOW_FILE_STORE=true; or remove mlflow from trainer.loggers"
        ) from exc


class WandbLogger:
    """A W&B run: one ``run.log`` per step, at that step."""

    def __init__(self, name: str, run_dir: Path, config: Mapping[str, Any], *, resumed: bool = False):
        import wandb

        id_file = Path(run_dir) / WANDB_ID_FILE
        # The W&B run id is not the run's name: W&B ids are unique per project for good, so reusing a
        # name (a rerun after deleting the run directory, the same name under another output_dir) would
        # append to the old W&B run, and W&B drops every step it already has.
        if resumed and id_file.is_file():
            run_id = id_file.read_text().strip()
        else:
            run_id = uuid.uuid4().hex[:12]
            id_file.parent.mkdir(parents=True, exist_ok=True)
            id_file.write_text(run_id + "\n")
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "rlcore"),
            name=name,
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            config=dict(config),
        )

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


_MLFLOW_REJECTS = re.compile(r"[^\w./\- ]")  # MLflow's allowed set (without ':', which Windows rejects)


def mlflow_name(key: str, *, file_store: bool) -> str:
    """A metric or param ``key`` as a name MLflow accepts: characters it rejects become ``_``; empty,
    ``.`` and ``..`` path segments go. In a file store ``/`` becomes ``.``: that store keeps each metric
    in a file at its name's path, so ``val/reward`` (a file) and ``val/reward/test/digits`` (inside a
    folder of that name) cannot both be there."""
    parts = [p for p in _MLFLOW_REJECTS.sub("_", key).split("/") if p not in ("", ".", "..")]
    return ("." if file_store else "/").join(parts)[:250] or "_"


class MlflowLogger:
    """An MLflow run, through an explicit client: no fluent ``active run`` that could clash with
    another in the same process."""

    def __init__(self, name: str, config: Mapping[str, Any]):
        import mlflow
        from mlflow.entities import Metric, Param

        self._metric = Metric
        uri = mlflow.get_tracking_uri()
        self.file_store = urlparse(uri).scheme in ("", "file")
        self.client = mlflow.tracking.MlflowClient(uri)
        experiment = mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME", "rlcore"))
        self.run_id = self.client.create_run(experiment.experiment_id, run_name=name).info.run_id
        params = [Param(mlflow_name(k, file_store=self.file_store), v) for k, v in _flatten(config).items()]
        self.client.log_batch(self.run_id, params=params)
        self._names: dict[str, str] = {}  # metric key -> MLflow name
        self._owner: dict[str, str] = {}  # MLflow name -> the metric key that has it

    def _name(self, key: str) -> str | None:
        name = self._names.get(key)
        if name is None:
            name = mlflow_name(key, file_store=self.file_store)
            other = self._owner.setdefault(name, key)
            if other != key:  # never both under one name: MLflow would interleave two series
                logger.warning(
                    "MLflow: metrics %r and %r both map to %r; logging only %r", other, key, name, other
                )
                name = ""
            self._names[key] = name
        return name or None

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        now = int(time.time() * 1000)
        batch = [
            self._metric(name, float(value), now, step)
            for key, value in metrics.items()
            if (name := self._name(key)) is not None
        ]
        self.client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = str(value)[:250]  # servers of older MLflow versions reject longer values
    return out

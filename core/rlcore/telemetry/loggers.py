"""Metric sinks of a run (``trainer.loggers``): console, JSONL, TensorBoard, W&B, MLflow.

Each sink has ``log(step, metrics)`` and ``close()``. The console shows a progress bar with the ETA and
one line of the main metrics per step; ``metrics.jsonl`` in the run directory gets one JSON object per
step (``{"step": 3, "reward/mean": ...}``), rewritten from the checkpoint's history when a run resumes
so that it never holds steps the resumed run repeats. TensorBoard, W&B and MLflow are optional imports:
TensorBoard (a default) is skipped with a warning when missing; W&B and MLflow, which a user asks for by
name, fail the run's start with the install command (see :mod:`rlcore.telemetry.trackers`).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from rlcore.telemetry.trackers import TRACKERS, MlflowLogger, WandbLogger, check_tracker

logger = logging.getLogger(__name__)

LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")
METRICS_FILE = "metrics.jsonl"

#: Metrics the console line shows, in order, with their short labels (the first present of each group).
CONSOLE_METRICS = (
    (("reward/mean",), "reward"),
    (("val/reward",), "val"),
    (("val/reward_after_sft",), "val after sft"),
    (("sft/loss",), "sft loss"),
    (("actor/kl_loss", "actor/reward_kl_penalty"), "kl"),
    (("actor/entropy",), "entropy"),
    (("actor/pg_clipfrac",), "clip"),
    (("response_length/mean",), "len"),
    (("timing/step",), "s"),
)


class MetricsLogger(Protocol):
    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"


def console_line(step: int, total: int, metrics: Mapping[str, float]) -> str:
    """``step 3/30  reward 0.41  val 0.39  kl 0.0012  len 42  s 1.2``."""
    parts = [f"step {step}/{total}"]
    for keys, label in CONSOLE_METRICS:
        for key in keys:
            if key in metrics:
                parts.append(f"{label} {_fmt(float(metrics[key]))}")
                break
    return "  ".join(parts)


class ConsoleLogger:
    """A rich progress bar (steps done, elapsed, ETA) and a line of the main metrics per step."""

    def __init__(self, total_steps: int, start_step: int = 0, console: Any = None):
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.console = console or Console()
        self.total = total_steps
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"),
            console=self.console,
            transient=False,
        )
        self.task = self.progress.add_task("train", total=total_steps, completed=start_step, info="")
        self.progress.start()

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        line = console_line(step, self.total, metrics)
        if step > 0:
            reward = metrics.get("reward/mean")
            info = f"reward {_fmt(reward)}" if reward is not None else ""
            self.progress.update(self.task, completed=step, info=info)
        self.progress.console.print(line, highlight=False, markup=False)

    def close(self) -> None:
        self.progress.stop()


class JsonlLogger:
    """One JSON object per step in ``path``; ``history`` (a resumed run's earlier steps) replaces the file."""

    def __init__(self, path: str | os.PathLike, history: Sequence[Mapping[str, Any]] = ()):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            for record in history:
                f.write(json.dumps(_jsonable(record)) + "\n")
        os.replace(tmp, self.path)
        self._file = open(self.path, "a")  # noqa: SIM115 (kept open for the run)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._file.write(json.dumps(_jsonable({"step": step, **metrics})) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _jsonable(record: Mapping[str, Any]) -> dict[str, Any]:
    # NaN/inf are not JSON: write them as null so every line parses with any JSON reader.
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file, in order."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class TensorBoardLogger:
    """Scalars under ``<run_dir>/tensorboard``."""

    def __init__(self, log_dir: str | os.PathLike):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


_INSTALL_TENSORBOARD = "pip install tensorboard"


def check_logger_names(names: Sequence[str]) -> None:
    """Unknown names, and trackers asked for that would fail (package missing, MLflow store unusable),
    fail before anything starts."""
    unknown = [n for n in names if n not in LOGGERS]
    if unknown:
        raise ValueError(f"trainer.loggers: unknown logger(s) {unknown}; choose from {', '.join(LOGGERS)}")
    for name in TRACKERS:
        if name in names:
            check_tracker(name)


def build_loggers(
    names: Sequence[str],
    run_dir: Path,
    *,
    total_steps: int,
    start_step: int,
    experiment_name: str,
    config: Mapping[str, Any],
    history: Sequence[Mapping[str, Any]] = (),
    console: Any = None,
) -> list[MetricsLogger]:
    """The sinks ``names`` asks for (see :data:`LOGGERS`)."""
    check_logger_names(names)
    sinks: list[MetricsLogger] = []
    for name in dict.fromkeys(names):
        if name == "console":
            sinks.append(ConsoleLogger(total_steps, start_step, console))
        elif name == "jsonl":
            sinks.append(JsonlLogger(run_dir / METRICS_FILE, history))
        elif name == "tensorboard":
            try:
                sinks.append(TensorBoardLogger(run_dir / "tensorboard"))
            except ImportError:
                logger.warning("tensorboard is not installed; skipping it (%s)", _INSTALL_TENSORBOARD)
        elif name == "wandb":
            sinks.append(WandbLogger(experiment_name, run_dir, config, resumed=start_step > 0))
        elif name == "mlflow":
            sinks.append(MlflowLogger(experiment_name, config))
    return sinks

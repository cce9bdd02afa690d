"""One training run from a validated config: ``rlcore train`` calls :func:`run_training`.

It resolves the model (``builtin:tiny`` is built into the cache on first use), makes the run directory
(``<trainer.output_dir>/<trainer.experiment_name>``, holding ``config.yaml``, ``metrics.jsonl``,
``checkpoints/``, ``curves.png``), runs the :class:`~rlcore.trainer.loop.Trainer`, and ends with a
summary. A failure stops the run with one clear message (the full traceback goes to ``error.log`` in the
run directory), never a wall of Ray internals; the :class:`RunResult` says what happened.

>>> from rlcore.config import load_config  # doctest: +SKIP
>>> result = run_training(load_config("grpo.yaml", ["trainer.total_steps=10"]))  # doctest: +SKIP
>>> result.ok, result.metrics_path  # doctest: +SKIP
(True, PosixPath('runs/grpo-20261122-101500/metrics.jsonl'))
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from rlcore.stream import STREAM_FILE, read_stream
from rlcore.telemetry.loggers import METRICS_FILE
from rlcore.telemetry.plotting import PLOT_FILE, plot_curves
from rlcore.telemetry.timeline import (
    REQUESTS_PLOT,
    TIMELINE_FILE,
    TIMELINE_PLOT,
    plot_requests,
    plot_timeline,
    read_timeline,
)

CONFIG_FILE = "config.yaml"
#: Folder of the run directory that built-in task files are written to.
DATA_DIR = "data"
ERROR_FILE = "error.log"
CACHE_ENV = "RLCORE_CACHE_DIR"


@attrs.define
class RunResult:
    """What a run did. ``ok`` is false when it stopped on an error (``error`` holds the message)."""

    ok: bool
    run_dir: Path | None = None
    metrics_path: Path | None = None
    plot_path: Path | None = None
    timeline_path: Path | None = None
    #: the newest checkpoint of the run, if any
    checkpoint: Path | None = None
    steps: int = 0
    val_reward_start: float | None = None
    val_reward_end: float | None = None
    error: str | None = None
    #: one record per logged step, as in ``metrics.jsonl``
    history: list[dict[str, Any]] = attrs.Factory(list)


# -- models ----------------------------------------------------------------------------------------
def cache_dir() -> Path:
    """Where built-in models are built: ``$RLCORE_CACHE_DIR``, else ``~/.cache/rlcore``."""
    return Path(os.environ.get(CACHE_ENV) or "~/.cache/rlcore").expanduser()


def resolve_model_path(path: str) -> str:
    """A model folder for ``path``: a built-in model (``builtin:<name>``, see :mod:`rlcore.models`) is
    built into :func:`cache_dir` once; a local folder is made absolute; any other name is taken as a
    Hugging Face hub id for the engines to fetch."""
    from rlcore.models import build_builtin, builtin_name

    name = builtin_name(path)
    if name is not None:
        return str(build_builtin(name, cache_dir()))
    local = Path(path).expanduser()
    if local.exists():
        return str(local.resolve())
    if path.startswith(("/", ".", "~")) or path.count("/") != 1:
        raise FileNotFoundError(
            f"model folder {path!r} does not exist. Set model.path to a local Hugging Face model folder, a hub "
            "id (org/name), or a built-in model (builtin:tiny, builtin:tiny-vlm, builtin:smollm2-135m-instruct)."
        )
    return path


def _write_builtin_data(config: Any, folder: Path) -> Any:
    """Write the built-in task files the config names (``builtin:<task>/<split>.jsonl``) into ``folder``
    and name their real paths instead (see :mod:`rlcore.tasks`)."""
    from rlcore.tasks import resolve_files

    data = attrs.evolve(
        config.data,
        train_files=resolve_files(config.data.train_files, folder),
        val_files=resolve_files(config.data.val_files, folder),
    )
    sft = attrs.evolve(config.sft, files=resolve_files(config.sft.files, folder))
    return attrs.evolve(config, data=data, sft=sft)


def prepare_run(config: Any) -> tuple[Any, Path, str]:
    """Resolve model paths and the rollout engine, create the run directory, write built-in task data
    into it and ``config.yaml``. Returns ``(resolved config, run_dir, config yaml)``."""
    from rlcore.config import to_yaml
    from rlcore.config.auto import resolve_auto
    from rlcore.distill.config import with_resolved_paths
    from rlcore.rewards.model_config import absolute_paths

    model = attrs.evolve(
        config.model,
        path=resolve_model_path(config.model.path),
        tokenizer_path=resolve_model_path(config.model.tokenizer_path)
        if config.model.tokenizer_path
        else None,
    )
    critic = config.critic
    if critic.model_path:
        critic = attrs.evolve(critic, model_path=resolve_model_path(critic.model_path))
    reward_model = absolute_paths(config.reward_model)
    teacher = with_resolved_paths(config.teacher, resolve_model_path)
    config = attrs.evolve(config, model=model, critic=critic, reward_model=reward_model, teacher=teacher)
    config, _ = resolve_auto(config)  # a config built in code may still say auto (load_config resolves)
    name = config.trainer.experiment_name or f"{config.algorithm.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = Path(config.trainer.output_dir).expanduser() / name
    run_dir.mkdir(parents=True, exist_ok=True)
    config = _write_builtin_data(config, run_dir / DATA_DIR)
    text = to_yaml(config)
    (run_dir / CONFIG_FILE).write_text(text)
    return config, run_dir, text


# -- the run ---------------------------------------------------------------------------------------
def run_training(
    config: Any, *, console: Any = None, early_warnings: Sequence[Any] = (), notes: Sequence[str] = ()
) -> RunResult:
    """Train as ``config`` says; print a summary; never raise for a failed run (see :class:`RunResult`).

    With ``trainer.log_level: quiet`` the run's own lines go to ``console`` (default: the terminal) and
    all other output of this process and the workers to ``<run dir>/logs/`` (:mod:`rlcore.telemetry.terminal`).
    ``early_warnings`` (``warnings.WarningMessage``) were caught before the run began (plugin imports)
    and are shown where the run's other library output goes. ``notes``: what the config's ``auto``
    values became and why (:func:`rlcore.config.load_config`), written to the driver's log."""
    with contextlib.ExitStack() as stack:
        return _run(config, console, stack, early_warnings, notes)


def _run(
    config: Any,
    console: Any,
    stack: contextlib.ExitStack,
    early_warnings: Sequence[Any],
    notes: Sequence[str] = (),
) -> RunResult:
    from rich.console import Console

    from rlcore.cluster.failures import WorkerFailure
    from rlcore.telemetry.terminal import LOGS_DIR, run_output
    from rlcore.trainer import checkpoint as ckpt
    from rlcore.trainer.loop import Trainer

    began = time.perf_counter()
    stop_ray = _ray_started_by_us(config)
    trainer = None
    failure: BaseException | None = None
    result = RunResult(ok=False)
    try:
        config, result.run_dir, text = prepare_run(config)
        terminal = stack.enter_context(run_output(result.run_dir, config.trainer.log_level))
        for w in early_warnings:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        for note in notes:
            print(f"rlcore: {note}", file=sys.stderr, flush=True)
        console = console or Console(file=terminal)  # file=None: the terminal, when not quiet
        console.print(f"[bold]rlcore[/bold] {config.algorithm.name} run in {result.run_dir}", highlight=False)
        if terminal is not None:
            console.print(f"engine and library logs: {result.run_dir / LOGS_DIR}", highlight=False)
        restarts = 0
        while True:
            trainer = Trainer(config, result.run_dir, console=console, config_yaml=text)
            trainer.restarts = restarts
            if trainer.resumed_from is not None:
                console.print(f"resumed from {trainer.resumed_from} at step {trainer.step}", highlight=False)
            try:
                trainer.fit()
                break
            except WorkerFailure as exc:
                if restarts >= config.trainer.max_restarts:
                    raise
                restarts += 1
                config = _restart(config, trainer, exc, restarts, console)
                trainer = None
        result.ok = True
    except (Exception, KeyboardInterrupt) as exc:
        failure = exc
    finally:
        console = console or Console()
        if trainer is not None:
            result.history = list(trainer.history)
            result.steps = max((int(r["step"]) for r in result.history), default=0)
            trainer.close()  # the progress bar stops before the error is printed
        if stop_ray():
            from rlcore.cluster.ray_cluster import stop_ray as stop

            stop()
    if failure is not None:
        result.error = _report_failure(failure, trainer, result.run_dir, console)
    if result.run_dir is None:
        return result
    result.checkpoint = ckpt.latest_checkpoint(result.run_dir)
    if (result.run_dir / METRICS_FILE).is_file() and "jsonl" in config.trainer.loggers:
        result.metrics_path = result.run_dir / METRICS_FILE
    vals = [r["val/reward"] for r in result.history if "val/reward" in r]
    result.val_reward_start, result.val_reward_end = (vals[0], vals[-1]) if vals else (None, None)
    if result.history:
        result.plot_path = plot_curves(result.history, result.run_dir / PLOT_FILE, title=result.run_dir.name)
    if (result.run_dir / TIMELINE_FILE).is_file():
        result.timeline_path = plot_timeline(
            read_timeline(result.run_dir / TIMELINE_FILE),
            result.run_dir / TIMELINE_PLOT,
            title=f"{result.run_dir.name}: trainer.mode={config.trainer.mode}",
        )
    if (result.run_dir / STREAM_FILE).is_file():
        plot_requests(
            read_stream(result.run_dir / STREAM_FILE),
            result.run_dir / REQUESTS_PLOT,
            title=f"{result.run_dir.name}: the stream's requests across steps",
        )
    _summary(result, config, time.perf_counter() - began, console)
    return result


def _restart(config: Any, trainer: Any, exc: Any, restarts: int, console: Any) -> Any:
    """After ``exc`` (a worker process died): stop every worker of ``trainer`` and return the config the
    next attempt runs with, resuming from the last checkpoint this run wrote or resumed from (a fresh start
    when it has none; never another run's checkpoint left in the directory). Says so on the console and in
    the driver's log."""
    at = trainer.step  # the step in progress (counted from its start), as the failure report says
    checkpoint = trainer.last_saved or trainer.resumed_from
    trainer.close()
    resume = str(checkpoint) if checkpoint is not None else "disable"
    line = (
        f"restart {restarts}/{config.trainer.max_restarts}: {exc.role} rank {exc.rank} died in {exc.phase} "
        f"at step {at}; every worker starts again from "
        + (f"checkpoint {checkpoint.name}" if checkpoint is not None else "the start (no checkpoint yet)")
        + " (trainer.max_restarts)"
    )
    print(f"rlcore: {line}", file=sys.stderr, flush=True)
    console.print(f"[bold yellow]{line}[/bold yellow]", highlight=False, markup=True, soft_wrap=True)
    return attrs.evolve(config, trainer=attrs.evolve(config.trainer, resume=resume))


def _ray_started_by_us(config: Any):
    """A callable telling, at the end, whether this run started Ray (and so should stop it)."""
    if config.trainer.backend != "ray":
        return lambda: False
    import ray

    was_up = ray.is_initialized()
    return lambda: not was_up and ray.is_initialized()


def _report_failure(exc: BaseException, trainer: Any, run_dir: Path | None, console: Any) -> str:
    """Print one clear message for ``exc`` (where it happened, what to do); the traceback goes to
    ``error.log``. Returns the message."""
    where = ""
    if trainer is not None and getattr(trainer, "ctx", None) is not None:
        phase = trainer.ctx.timer.current
        where = f" at step {trainer.step}" + (f" in phase {phase!r}" if phase else "")
    elif trainer is None:
        where = " during setup"
    if isinstance(exc, KeyboardInterrupt):
        message = f"interrupted{where}"
    else:
        message = f"training stopped{where}: {type(exc).__name__}: {exc}"
    console.print(f"[bold red]error[/bold red] {message}", highlight=False, markup=True, soft_wrap=True)
    if run_dir is not None:
        log = run_dir / ERROR_FILE
        log.write_text("".join(traceback.format_exception(exc)))
        console.print(f"full traceback: {log}", highlight=False)
        from rlcore.trainer.checkpoint import latest_checkpoint

        if trainer is not None and latest_checkpoint(run_dir) is not None:
            console.print(
                f"resume from the last checkpoint with trainer.experiment_name={run_dir.name} "
                f"trainer.output_dir={run_dir.parent} (trainer.resume=auto)",
                highlight=False,
            )
    if not _expected(exc):
        # Called after the except block has ended, so take the traceback from ``exc`` itself.
        console.print("".join(traceback.format_exception(exc)), highlight=False, markup=False)
    return message


def _expected(exc: BaseException) -> bool:
    """Errors whose message says everything (bad data, reward, config, a worker's own report)."""
    from rlcore.algorithms.dapo import DynamicSamplingExhausted
    from rlcore.cluster.failures import WorkerError, WorkerFailure, WorkerTimeout
    from rlcore.data import DataError
    from rlcore.plugins.registries import RegistryError
    from rlcore.rewards import RewardError
    from rlcore.rollout.sync_check import WeightSyncMismatch
    from rlcore.trainer.checkpoint import CheckpointError

    kinds = (
        DataError,
        RewardError,
        RegistryError,
        WorkerError,
        WorkerFailure,
        WorkerTimeout,
        CheckpointError,
        DynamicSamplingExhausted,
        WeightSyncMismatch,
        KeyboardInterrupt,
        ValueError,
        FileNotFoundError,
    )
    return isinstance(exc, kinds)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f}s"


def _summary(result: RunResult, config: Any, seconds: float, console: Any) -> None:
    status = "[green]done[/green]" if result.ok else "[red]stopped[/red]"
    steps = f"{result.steps}/{config.trainer.total_steps} steps"
    lines = [f"{status}: {config.algorithm.name}, {steps} in {_duration(seconds)}"]
    if result.history:  # nothing else to show for a run that stopped during setup
        vals = [r for r in result.history if "val/reward" in r]
        after_sft = result.history[0].get("val/reward_after_sft")
        warm = f"{after_sft:.4f} after the SFT warm-up -> " if after_sft is not None else ""
        if len(vals) > 1:
            lines.append(
                f"  validation reward: {result.val_reward_start:.4f} at the start -> {warm}"
                f"{result.val_reward_end:.4f} at the end"
            )
        elif vals:
            lines.append(
                f"  validation reward: {result.val_reward_start:.4f} at step {vals[0]['step']} (once)"
            )
        else:
            lines.append("  validation reward: none (no data.val_files)")
        lines.append(f"  metrics:    {result.metrics_path or '(trainer.loggers has no jsonl)'}")
        lines.append(f"  curves:     {result.plot_path}")
        if result.timeline_path is not None:
            lines.append(f"  timeline:   {result.timeline_path}")
    if result.checkpoint is not None:
        lines.append(f"  checkpoint: {result.checkpoint}")
    for line in lines:
        console.print(line, highlight=False)

"""The W&B and MLflow sinks with the real packages (CI installs both), read back from what they wrote
locally, a W&B offline run and an MLflow file store, and compared with ``metrics.jsonl`` of the same run."""

from __future__ import annotations

import importlib.util
import io
import json
import math
import struct
import sys
from pathlib import Path

import mlflow
import pytest
import wandb
from rich.console import Console
from rlcore.telemetry.loggers import build_loggers, check_logger_names, read_metrics
from rlcore.telemetry.trackers import WANDB_ID_FILE, mlflow_name
from rlcore.trainer.run import run_training
from wandb.proto import wandb_internal_pb2

_spec = importlib.util.spec_from_file_location(
    "trainer_task", Path(__file__).parents[1] / "trainer" / "trainer_task.py"
)
task = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(task)

CONFIG = {"trainer": {"total_steps": 3, "loggers": ["jsonl", "wandb", "mlflow"]}, "model": {"path": "m"}}
#: Metric names as a run writes them: a name that is a path prefix of others (val/reward), and a data
#: source with characters MLflow rejects.
STEPS = [
    {"val/reward": 0.25, "val/reward/test/digits": 0.5, "val/reward/hub:set,v2": 0.125},
    {"reward/mean": 0.1, "actor/kl_loss": float("nan"), "perf/tokens_per_s": 1234.5, "sync/bytes": 4096.0},
    {"reward/mean": 0.3, "actor/kl_loss": 1e-9, "perf/tokens_per_s": 1e6 / 3, "sync/bytes": 4096.0},
]


@pytest.fixture
def trackers(tmp_path, monkeypatch):
    """W&B offline and MLflow on a file store, everything under ``tmp_path``; returns the store's URI."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "rlcore-test")
    for var, folder in (
        ("WANDB_CONFIG_DIR", "config"),
        ("WANDB_CACHE_DIR", "cache"),
        ("WANDB_DATA_DIR", "data"),
    ):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / folder))
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.17 refuses a file store otherwise
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "rlcore-test")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    return uri


# -- reading back what the trackers wrote -----------------------------------------------------------


def wandb_records(path: Path):
    """The protobuf ``Record`` messages of a ``.wandb`` file: W&B's LevelDB-style log (a 7-byte file
    header, then 32 KiB blocks of records, each with a 7-byte header; a record may span blocks)."""
    blob = path.read_bytes()
    assert struct.unpack("<4sHB", blob[:7]) == (b":W&B", 0xBEE1, 0), f"not a W&B log: {path}"
    pos, pending = 7, b""
    while pos + 7 <= len(blob):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _crc, length, kind = struct.unpack("<IHB", blob[pos : pos + 7])
        data, pos = blob[pos + 7 : pos + 7 + length], pos + 7 + length
        pending = data if kind in (1, 2) else pending + data  # full, first | middle, last
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def wandb_runs(run_dir: Path) -> list[tuple[str, dict, dict[int, dict[str, float]]]]:
    """``(run id, config, {step: metrics})`` of each W&B run written under ``run_dir``, oldest first."""
    # run.finish() can return before W&B's service has written all of an offline run's file (seen under
    # load, for a run started in the same second as the previous one of its id); stopping the service
    # waits for every write, as the end of the process does.
    wandb.teardown()
    runs = []
    for path in (run_dir / "wandb").glob("offline-run-*/run-*.wandb"):
        run_id, config, history, start = None, {}, {}, 0.0
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run_id, start = record.run.run_id, record.run.start_time.ToNanoseconds()
                config = {i.key: json.loads(i.value_json) for i in record.run.config.update}
            elif kind == "history":
                row = {}
                for item in record.history.item:
                    key = item.key or ".".join(item.nested_key)
                    field = item.WhichOneof("value")
                    row[key] = getattr(item, field) if field else json.loads(item.value_json)
                history[record.history.step.num] = {k: v for k, v in row.items() if not k.startswith("_")}
        runs.append((start, run_id, config, history))
    return [run[1:] for run in sorted(runs, key=lambda run: run[0])]


def mlflow_runs(uri: str) -> list[tuple[mlflow.entities.Run, dict[int, dict[str, float]]]]:
    """Each run of the ``rlcore-test`` experiment with its ``{step: {metric name: value}}``."""
    client = mlflow.tracking.MlflowClient(uri)
    experiment = client.get_experiment_by_name("rlcore-test")
    out = []
    for run in client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"]):
        history: dict[int, dict[str, float]] = {}
        for name in run.data.metrics:
            for m in client.get_metric_history(run.info.run_id, name):
                history.setdefault(m.step, {})[name] = m.value
        out.append((run, history))
    return out


def assert_matches_jsonl(history: dict[int, dict[str, float]], records: list[dict], name=lambda k: k) -> None:
    """Every step and value of ``metrics.jsonl``, no more, under the tracker's ``name`` of each key.
    jsonl writes non-finite values as null; the trackers keep them."""
    assert sorted(history) == [r["step"] for r in records]
    for record in records:
        want = {name(k): v for k, v in record.items() if k != "step"}
        got = history[record["step"]]
        assert sorted(got) == sorted(want), f"step {record['step']}"
        for key, value in want.items():
            if value is None:
                assert not math.isfinite(got[key]), f"step {record['step']} {key}: {got[key]}"
            else:
                assert got[key] == value, f"step {record['step']} {key}: {got[key]} != {value}"


# -- the sinks --------------------------------------------------------------------------------------


def test_wandb_and_mlflow_log_what_metrics_jsonl_holds(tmp_path, trackers):
    run_dir = tmp_path / "runs" / "grpo-20260101-000000"
    sinks = build_loggers(
        ["jsonl", "wandb", "mlflow"],
        run_dir,
        total_steps=2,
        start_step=0,
        experiment_name=run_dir.name,
        config=CONFIG,
    )
    for step, metrics in enumerate(STEPS):
        for sink in sinks:
            sink.log(step, metrics)
    for sink in sinks:
        sink.close()
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2] and records[1]["actor/kl_loss"] is None

    [(run_id, config, history)] = wandb_runs(run_dir)
    assert run_id == (run_dir / WANDB_ID_FILE).read_text().strip()
    assert {k: config[k] for k in CONFIG} == CONFIG
    assert_matches_jsonl(history, records)

    [(run, history)] = mlflow_runs(trackers)
    assert run.info.run_name == run_dir.name and run.info.status == "FINISHED"
    assert run.data.params["trainer.loggers"] == "['jsonl', 'wandb', 'mlflow']"
    # A file store keeps val/reward as a file and val/reward/test/digits under a folder of that name:
    # both fit only with '.' for '/'; ':' and ',' are not allowed in MLflow names.
    assert {"val.reward", "val.reward.test.digits", "val.reward.hub_set_v2"} <= set(run.data.metrics)
    assert_matches_jsonl(history, records, lambda key: mlflow_name(key, file_store=True))


def test_a_training_run_logs_the_same_metrics_to_wandb_mlflow_and_jsonl(tmp_path, trackers, tiny_model_path):
    files = task.write_task(tmp_path / "task")
    config = task.task_config(
        tmp_path,
        files,
        model__path=tiny_model_path,
        trainer__loggers="[jsonl,wandb,mlflow]",
        trainer__total_steps=2,
    )
    result = run_training(config, console=Console(file=io.StringIO(), width=200))
    assert result.ok, result.error
    records = read_metrics(result.metrics_path)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert {"val/reward", "val/reward/test/digits", "reward/mean", "actor/grad_norm"} <= set(
        records[0]
    ) | set(records[1])

    [(_, config, history)] = wandb_runs(result.run_dir)
    assert config["trainer"]["total_steps"] == 2 and config["trainer"]["loggers"] == [
        "jsonl",
        "wandb",
        "mlflow",
    ]
    assert_matches_jsonl(history, records)

    [(run, history)] = mlflow_runs(trackers)
    assert run.info.run_name == "run" and run.data.params["trainer.total_steps"] == "2"
    assert_matches_jsonl(history, records, lambda key: mlflow_name(key, file_store=True))


def test_a_fresh_run_gets_a_new_wandb_run_and_a_resumed_one_continues_it(tmp_path, trackers):
    run_dir = tmp_path / "runs" / "same-name"

    def run(start_step: int, steps: range) -> None:
        [sink] = build_loggers(
            ["wandb"], run_dir, total_steps=4, start_step=start_step, experiment_name=run_dir.name, config={}
        )
        for step in steps:
            sink.log(step, {"reward/mean": float(step)})
        sink.close()

    run(0, range(3))  # a first run, its directory deleted (here: forgotten) and the name reused
    run(0, range(2))  # a fresh run: W&B would drop steps 0 and 1 from the first run's id
    run(2, range(3, 4))  # resumed from the step-2 checkpoint of the second run
    (first, _, h1), (second, _, h2), (resumed, _, h3) = wandb_runs(run_dir)
    assert first != second and resumed == second
    assert (run_dir / WANDB_ID_FILE).read_text().strip() == second
    assert [sorted(h) for h in (h1, h2, h3)] == [[0, 1, 2], [0, 1], [3]]


# -- failing before the run starts ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_a_tracker_whose_package_is_missing_fails_with_the_install_command(monkeypatch, name):
    monkeypatch.setitem(sys.modules, name, None)  # what `import name` and find_spec see when it is absent
    with pytest.raises(ValueError, match=f"the {name} package is not installed: pip install {name}"):
        check_logger_names(["console", name])


def test_an_mlflow_store_that_cannot_open_fails_before_the_run_starts(tmp_path, trackers, monkeypatch):
    check_logger_names(["mlflow"])  # the fixture's store opens
    # Another store (MLflow caches opened stores by URI), which MLflow refuses to open.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "other-mlruns").as_uri())
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    with pytest.raises(ValueError, match="cannot open its tracking store .*MLFLOW_ALLOW_FILE_STORE=true"):
        check_logger_names(["mlflow"])


def test_mlflow_names():
    assert mlflow_name("val/reward/test/digits", file_store=False) == "val/reward/test/digits"
    assert mlflow_name("val/reward/test/digits", file_store=True) == "val.reward.test.digits"
    assert mlflow_name("val/reward/hub:set,v2", file_store=False) == "val/reward/hub_set_v2"
    # Segments MLflow refuses as paths (empty, '.', '..') go.
    assert mlflow_name("val/reward//../x/", file_store=False) == "val/reward/x"
    assert mlflow_name("", file_store=True) == "_"

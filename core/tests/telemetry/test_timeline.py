"""The run's timeline (intervals per phase, role and rank, and its picture) and the trained-samples record."""

from __future__ import annotations

import json
import threading

import torch
from rlcore.api import Batch
from rlcore.telemetry.samples import TrainedSamples, read_samples, trained_rows
from rlcore.telemetry.timeline import Timeline, plot_timeline, read_timeline

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_each_phase_is_an_interval_per_role_and_rank_from_any_thread(tmp_path):
    path = tmp_path / "timeline.jsonl"
    timeline = Timeline(path, ranks={"actor": 2, "rollout": 1})
    t0 = timeline.origin

    def write(k):
        timeline.record("update_actor", t0 + k, t0 + k + 0.5, step=k, version=k - 1)

    threads = [threading.Thread(target=write, args=(k,)) for k in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    timeline.record("sync_weights", t0 + 9, t0 + 9.25, step=4, version=4)
    timeline.record("advantages", t0 + 10, t0 + 10.5, step=5, version=4)
    rows = read_timeline(path)
    assert rows == timeline.intervals
    updates = [r for r in rows if r["phase"] == "update_actor"]
    assert sorted((r["step"], r["rank"]) for r in updates) == [
        (k, rank) for k in range(1, 5) for rank in (0, 1)
    ]
    assert all(
        r["role"] == "actor" and r["end"] - r["start"] == 0.5 and r["version"] == r["step"] - 1
        for r in updates
    )
    sync = [r for r in rows if r["phase"] == "sync_weights"]
    assert sorted((r["role"], r["rank"]) for r in sync) == [("actor", 0), ("actor", 1), ("rollout", 0)]
    assert [r["role"] for r in rows if r["phase"] == "advantages"] == ["driver"]
    out = plot_timeline(rows, tmp_path / "timeline.png", title="t")
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert plot_timeline(rows, tmp_path / "tail.png", last_s=2).read_bytes()[:8] == PNG_MAGIC


def _batch():
    versions = torch.tensor([[2, 3, -1], [3, 3, 3]])
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    return Batch({"policy_version": versions, "response_mask": mask}, {"index": [7, 7]}, {})


def test_trained_rows_and_a_resume_drops_the_steps_after_its_checkpoint(tmp_path):
    rows = trained_rows(_batch())
    assert rows == {"index": [7, 7], "oldest": [2, 3], "newest": [3, 3]}
    path = tmp_path / "trained_samples.jsonl"
    log = TrainedSamples(path)
    for step in range(1, 5):
        log.write(step, step - 1, rows)
    log.write(5, 4, {"index": [1, 1]})  # a synchronous step: no versions recorded, on-policy
    assert read_samples(path)[-1] == {
        "step": 5,
        "version": 4,
        "index": [1, 1],
        "oldest": [4, 4],
        "newest": [4, 4],
    }
    TrainedSamples(path, keep_through=2)  # resumed from step 2's checkpoint
    assert [line["step"] for line in read_samples(path)] == [1, 2]
    assert json.loads(path.read_text().splitlines()[0])["oldest"] == [2, 3]


def test_the_stream_picture_draws_each_group_across_the_steps_it_lived(tmp_path):
    from rlcore.telemetry.timeline import plot_requests

    lines = [
        {
            "seq": 0,
            "outcome": "trained",
            "admitted_at": 0.0,
            "finished_at": 1.0,
            "left_at": 1.5,
            "left_step": 1,
        },
        {
            "seq": 1,
            "outcome": "trained",
            "admitted_at": 0.0,
            "finished_at": 2.5,
            "left_at": 3.0,
            "left_step": 2,
        },
        {
            "seq": 2,
            "outcome": "stale",
            "admitted_at": 0.1,
            "finished_at": None,
            "left_at": 3.0,
            "left_step": 2,
        },
    ]
    path = plot_requests(lines, tmp_path / "stream.png", title="two steps")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

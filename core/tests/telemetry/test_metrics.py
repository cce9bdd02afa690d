"""Step metrics, metric sinks and the curves PNG, against values worked out by hand."""

from __future__ import annotations

import io
import json
import math

import pytest
import torch
from rich.console import Console
from rlcore.api import Batch
from rlcore.telemetry import plotting
from rlcore.telemetry.loggers import (
    ConsoleLogger,
    JsonlLogger,
    build_loggers,
    check_logger_names,
    console_line,
    read_metrics,
)
from rlcore.telemetry.metrics import PhaseTimer, batch_metrics, mean_by, prefixed, throughput
from rlcore.telemetry.plotting import plot_curves, series


def example_batch() -> Batch:
    # Two prompts of lengths 2 and 3 (left-padded to 3), responses of lengths 3 and 1 (padded to 4).
    response_mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    scores = torch.zeros(2, 4)
    scores[0, 2], scores[1, 0] = 1.0, 0.25
    rewards = scores.clone()
    rewards[0, 0] -= 0.1  # a KL penalty on one token
    advantages = torch.tensor([[0.5, -1.0, 2.0, 9.0], [3.0, 9.0, 9.0, 9.0]])  # 9s sit on padding
    return Batch(
        {
            "response_mask": response_mask,
            "attention_mask": torch.cat([prompt_mask, response_mask], 1),
            "token_level_scores": scores,
            "token_level_rewards": rewards,
            "advantages": advantages,
            "returns": advantages.clone(),
        }
    )


def test_batch_metrics_match_hand_computed_values():
    m = batch_metrics(example_batch(), max_response_length=3)
    assert m["reward/mean"] == pytest.approx(0.625)
    assert m["reward/max"] == 1.0 and m["reward/min"] == 0.25
    assert m["reward/std"] == pytest.approx(math.sqrt(((1 - 0.625) ** 2 + (0.25 - 0.625) ** 2) / 1))
    assert m["reward/final/mean"] == pytest.approx((0.9 + 0.25) / 2)
    # Valid tokens only: 0.5, -1, 2, 3.
    assert m["advantages/mean"] == pytest.approx(1.125)
    assert m["advantages/max"] == 3.0 and m["advantages/min"] == -1.0
    assert "returns/mean" not in m  # equal to the advantages: reported once
    assert m["response_length/mean"] == 2.0 and m["response_length/max"] == 3.0
    assert m["response_length/clip_ratio"] == 0.5  # one of two responses reached 3 tokens
    assert m["prompt_length/mean"] == 2.5
    assert m["tokens/total"] == 9.0 and m["tokens/response"] == 4.0


def test_batch_metrics_without_kl_penalty_skip_final_reward():
    batch = example_batch()
    batch.tensors["token_level_rewards"] = batch["token_level_scores"].clone()
    batch.tensors["returns"] = batch["advantages"] + 1
    m = batch_metrics(batch)
    assert "reward/final/mean" not in m and "response_length/clip_ratio" not in m
    assert m["returns/mean"] == pytest.approx(2.125)


def test_phase_timer_sums_repeats_and_names_the_failing_phase():
    timer = PhaseTimer()
    with timer("generate"):
        pass
    with timer("generate"):
        pass
    assert set(timer.metrics()) == {"timing/generate"} and timer.current is None
    with pytest.raises(RuntimeError), timer("score"):
        raise RuntimeError("boom")
    assert timer.current == "score" and "timing/score" in timer.metrics()


def test_small_helpers():
    assert throughput(1000, 400, 2.0, 0.5) == {
        "perf/tokens_per_s": 500.0,
        "perf/generate_tokens_per_s": 800.0,
    }
    assert prefixed("actor", {"loss": 1, "actor/pg_loss": 2}) == {"actor/loss": 1.0, "actor/pg_loss": 2.0}
    assert mean_by(["a", "b", "a"], [1.0, 5.0, 2.0]) == {"a": 1.5, "b": 5.0}


def test_console_line_shows_the_main_metrics_in_order():
    line = console_line(3, 30, {"timing/step": 1.25, "reward/mean": 0.5, "actor/reward_kl_penalty": 0.0004})
    assert line == "step 3/30  reward 0.5  kl 4.00e-04  s 1.25"


def test_console_logger_prints_a_line_per_step():
    out = io.StringIO()
    sink = ConsoleLogger(4, 1, Console(file=out, width=120))
    sink.log(2, {"reward/mean": 0.25})
    sink.close()
    assert "step 2/4  reward 0.25" in out.getvalue()


def test_jsonl_rewrites_history_and_writes_nan_as_null(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}\n{"step": 2}\n')  # a killed run's lines
    sink = JsonlLogger(path, history=[{"step": 0, "val/reward": 0.1}])
    sink.log(1, {"reward/mean": float("nan"), "x": 2.0})
    sink.close()
    assert read_metrics(path) == [{"step": 0, "val/reward": 0.1}, {"step": 1, "reward/mean": None, "x": 2.0}]
    for line in path.read_text().splitlines():
        json.loads(line)


def test_logger_names_are_checked(tmp_path):
    with pytest.raises(ValueError, match="unknown logger"):
        check_logger_names(["console", "neptune"])
    # Trackers (W&B, MLflow): test_trackers.py.
    sinks = build_loggers(
        ["jsonl", "tensorboard", "jsonl"],
        tmp_path,
        total_steps=2,
        start_step=0,
        experiment_name="x",
        config={},
    )
    assert [type(s).__name__ for s in sinks] == ["JsonlLogger", "TensorBoardLogger"]
    for sink in sinks:
        sink.close()


def test_plot_curves_writes_a_png_with_available_panels(tmp_path):
    history = [
        {"step": 0, "val/reward": 0.1},
        {"step": 1, "reward/mean": 0.2, "response_length/mean": 5.0, "actor/kl_loss": None},
        {"step": 2, "reward/mean": float("nan"), "val/reward": 0.3},
    ]
    assert series(history, "reward/mean") == ([1], [0.2])
    assert series(history, "val/reward") == ([0, 2], [0.1, 0.3])
    path = plot_curves(history, tmp_path / "curves.png", title="t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_curves_draw_every_mismatch_metric_the_run_records(tmp_path):
    """The post-sync check's metrics (``sync/``) and the batch's (``rollout/``, the same names) each have
    a line in the mismatch panels: the plot picks series by name, so a renamed metric would vanish."""
    from rlcore.rollout.sync_check import compare_log_probs

    reported = compare_log_probs([[-1.0, -2.0]], torch.tensor([[-1.1, -2.3]]), torch.ones(1, 2))
    del reported["sync/probe_tokens"]  # a count of tokens, not a curve
    drawn = (
        {k for _, keys in plotting.PANELS for k in keys}
        | {k for lines in plotting.LINES.values() for k, _ in lines}
        | {k for pairs in plotting.RIGHT_AXIS.values() for k, _ in pairs}
    )
    assert set(reported) <= drawn, set(reported) - drawn
    batch = {k.replace("sync/", "rollout/") for k in reported}
    assert batch <= drawn, batch - drawn
    history = [{"step": s, **reported, **{k.replace("sync/", "rollout/"): v for k, v in reported.items()}}
               for s in range(3)]  # fmt: skip
    assert plot_curves(history, tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

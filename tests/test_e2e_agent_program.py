"""End to end: an agent program written with the ``openai`` package (examples/agents/calculator_agent.py,
run as an external command once per episode) as the rollout of GRPO on the built-in ``tool_add`` task,
with the HF rollout on the embedded local Ray, one step off-policy (docs/async.md).

The actor scores the trained rows' ids as the rollout sampled them (log-prob gap of the on-policy step
at the fp32 floor), every token carries the version of the weights that sampled it (step 2's episodes
ran under version 0), the agent's echoed replies are never counted as edits, and the row's reward
function scores the episodes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from rlcore.cluster.ray_cluster import stop_ray
from rlcore.config import load_config
from rlcore.trainer.loop import Trainer
from rlcore.trainer.run import prepare_run

pytestmark = pytest.mark.slow
pytest.importorskip("openai")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "agents" / "calculator_agent.py"


def test_an_openai_agent_command_trains_on_its_sampled_tokens(tmp_path):
    config = load_config(
        overrides=[
            "data.train_files=[builtin:tool_add/train.jsonl]",
            "data.val_files=[]",
            f"trainer.output_dir={tmp_path / 'runs'}",
            "trainer.experiment_name=agent-program",
            "trainer.loggers=[jsonl]",
            "trainer.val_freq=0",
            "trainer.total_steps=2",
            "trainer.warmup_sft_steps=0",  # the plumbing, not the learning: the random model may never call
            "trainer.mode=one_step_off",
            "data.train_batch_size=2",
            "rollout.n=2",
            "rollout.engine=hf",
            "rollout.max_response_length=48",
            "actor.recompute_old_log_probs=always",  # rollout/logprob_diff_* every step
            f"agent.command=[{sys.executable}, {EXAMPLE}]",
            "agent.max_turns=3",
            "agent.episode_timeout_s=120",
        ]
    )
    assert config.agent.enabled  # a program turns the agent on
    config, run_dir, text = prepare_run(config)
    trainer = Trainer(config, run_dir, config_yaml=text)
    try:
        trainer.fit()
        steps = [r for r in trainer.history if r["step"] > 0]
        assert len(steps) == 2
        for r in steps:
            assert (
                r["agent/requests/mean"] >= 1 and r["agent/stop_error"] == 0 and r["agent/stop_timeout"] == 0
            )
            assert r["agent/history_edits/mean"] == 0 and r["agent/dropped_tokens/mean"] == 0
            assert "reward/mean" in r
        assert [r["off_policy/staleness_max"] for r in steps] == [0, 1]
        first, second = steps
        assert first["rollout/logprob_diff_mean"] < 2e-3  # the actor scores exactly the sampled ids
        assert second["rollout/logprob_diff_mean"] > first["rollout/logprob_diff_mean"]
    finally:
        trainer.close()
        stop_ray()

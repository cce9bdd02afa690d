"""SGLang serving rlcore's LoRA adapter on a CUDA GPU (issue 53): after an adapter-only sync from rlcore's
FSDP engine, SGLang's log-probs are the trainer's ``W x + scale * B (A x)``, not the base model's; a
second sync replaces the adapter. Its own module (and process): SGLang's shutdown ends every child
process of the process, so a second engine cannot share test_engine_gpu.py's. Skipped where there is no
CUDA GPU or no sglang (CI); run on the lent GPU machine (``python -m benchmarks.gpu sglang-tests-lora``).
"""

import importlib.util
import os
from pathlib import Path

import pytest
import torch
from rlcore.api import LoraSpec, RolloutSpec, SamplingParams
from rlcore.devices import get_platform

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="needs sglang (CUDA machines)"),
]

LORA = LoraSpec(rank=8, alpha=16.0)
SAMPLING = SamplingParams(n=4, temperature=1.0, max_tokens=16, seed=5)
#: As in test_engine_gpu.py: two bf16 implementations of one model differ by rounding alone.
BF16_MEAN_GAP = 0.03


@pytest.fixture(scope="module")
def model_path(tiny_model_path) -> Path:
    return Path(os.environ.get("RLCORE_SGLANG_TEST_MODEL") or tiny_model_path)


@pytest.fixture(scope="module")
def trainer(model_path):
    from rlcore.api import DistInfo, EngineSpec
    from rlcore_fsdp.config import FSDPConfig
    from rlcore_fsdp.engine import FSDPEngine

    spec = EngineSpec(model_path=str(model_path), dtype="bfloat16", lr=2e-3, temperature=1.0, lora=LORA)
    engine = FSDPEngine(spec, FSDPConfig(), get_platform("cuda"), DistInfo())
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def engine(model_path):
    from rlcore_sglang.config import SGLangConfig
    from rlcore_sglang.engine import SGLangRollout

    spec = RolloutSpec(model_path=str(model_path), dtype="bfloat16", max_model_len=1024, seed=0, lora=LORA)
    rollout = SGLangRollout(spec, SGLangConfig(mem_fraction_static=0.3), get_platform("cuda"))
    yield rollout
    rollout.shutdown()


def _train(trainer, steps: int, seed: int) -> None:
    from rlcore.testing.contract import contract_batch, token_nll_loss

    for step in range(steps):
        trainer.train_step(contract_batch(8, vocab_low=3, vocab_high=200, seed=seed + step), token_nll_loss)


def _gaps(engine, trainer) -> dict[str, float]:
    from rlcore.rollout.batching import completions_to_batch

    g = torch.Generator().manual_seed(1)
    probe = [torch.randint(3, 200, (40 + 7 * i,), generator=g).tolist() for i in range(4)]
    batch = completions_to_batch([c for group in engine.generate(probe, SAMPLING) for c in group], 0)
    scored = trainer.infer(batch, ["log_probs", "base_log_probs"])
    mask = batch["response_mask"].bool()
    rollout = batch["rollout_log_probs"].double()
    return {
        "adapter": float((rollout - scored["log_probs"].double())[mask].abs().mean()),
        "base": float((rollout - scored["base_log_probs"].double())[mask].abs().mean()),
    }


def test_the_adapter_sync_makes_sglang_compute_the_trainers_adapted_log_probs(engine, trainer):
    assert engine.loads_adapters()
    _train(trainer, 3, seed=0)
    adapter = list(trainer.export_adapter(torch.bfloat16, 8 << 20))
    sent = sum(t.numel() for bucket in adapter for _, t in bucket)
    engine.load_weights(adapter)
    first = _gaps(engine, trainer)
    print(f"\nsglang adapter sync 1 ({sent} numbers): {first}")
    assert first["adapter"] < BF16_MEAN_GAP
    assert first["base"] > 5 * first["adapter"], "the adapter moved the policy; SGLang must follow it"

    _train(trainer, 3, seed=10)  # a second sync replaces the first adapter
    engine.load_weights(trainer.export_adapter(torch.bfloat16, 8 << 20))
    second = _gaps(engine, trainer)
    print(f"sglang adapter sync 2: {second}")
    assert second["adapter"] < BF16_MEAN_GAP
    assert engine.adapter.name == "rlcore-v2"

"""The FSDP engine's exports of a mixture of experts: transformers 5 holds each layer's experts as fused
tensors in memory (``mlp.experts.gate_up_proj [E, 2I, H]``), but the weight stream and ``export_hf``
carry the checkpoint's per-expert tensors, which vLLM, SGLang and ``from_pretrained`` load."""

import pytest
import torch
from rlcore.api import DistInfo, EngineSpec
from rlcore.devices import get_platform
from rlcore.testing.contract import contract_batch, token_nll_loss
from rlcore.testing.tiny import build_tiny_model
from rlcore.weights import assemble
from rlcore_fsdp.config import FSDPConfig
from rlcore_fsdp.engine import FSDPEngine
from safetensors.torch import load_file


@pytest.mark.parametrize("architecture", ["qwen3_moe", "mixtral"])
def test_exports_carry_the_checkpoints_per_expert_tensors(architecture, tmp_path_factory, tmp_path):
    path = build_tiny_model(
        tmp_path_factory.mktemp(f"fsdp-tiny-{architecture}"),
        architecture=architecture,
        hidden_size=64,
        intermediate_size=32,
        num_layers=2,
        num_experts=4,
    )
    checkpoint = load_file(str(path / "model.safetensors"))
    engine = FSDPEngine(
        EngineSpec(model_path=str(path), dtype="float32", lr=1e-2),
        FSDPConfig(),
        get_platform("cpu"),
        DistInfo(),
    )
    try:
        exported = dict(assemble(engine.export_weights(torch.float32, bucket_bytes=16 * 1024)))
        assert set(exported) == set(checkpoint) | {"lm_head.weight"}, "checkpoint names, plus the tied head"
        for name, tensor in checkpoint.items():
            assert torch.equal(exported[name], tensor), name

        engine.train_step(contract_batch(4, vocab_low=3, vocab_high=1000), token_nll_loss)
        trained = dict(assemble(engine.export_weights(torch.float32, bucket_bytes=16 * 1024)))
        engine.export_hf(str(tmp_path / "hf"))
    finally:
        engine.close()
    saved = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert set(saved) == set(checkpoint)
    for name, tensor in saved.items():
        assert torch.equal(tensor, trained[name]), name
    expert = next(n for n in checkpoint if ".experts.3." in n)
    assert not torch.equal(trained[expert], checkpoint[expert]), "training moved the experts"

"""LoRA on the FSDP engine (``EngineSpec.lora``), against independent float64 references.

The reference for training is a plain loop: the HF model run through ``torch.func.functional_call`` with
``W + scale * B A`` in place of each adapted weight, ``A`` and ``B`` plain float64 leaves, summed per-row
gradients and ``torch.optim.AdamW``; no PEFT and no FSDP. The exported adapter is read back with PEFT
itself, the merged folder with plain transformers.
"""

from __future__ import annotations

import json

import pytest
import torch
from fsdp_support import batch, row_log_probs
from rlcore.api import DistInfo, EngineSpec, LoraSpec
from rlcore.devices import get_platform
from rlcore.weights import assemble
from rlcore_fsdp.config import FSDPConfig
from rlcore_fsdp.engine import FSDPEngine
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

LORA = LoraSpec(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "down_proj"))
TEMPERATURE = 0.8
STEPS = 3


def make(model_path, lora=LORA, **overrides) -> FSDPEngine:
    fields = dict(
        model_path=str(model_path),
        dtype="float64",
        lr=1e-2,
        weight_decay=0.01,
        grad_clip=0.0,
        micro_batch_size=3,
        temperature=TEMPERATURE,
        lora=lora,
    )
    return FSDPEngine(EngineSpec(**{**fields, **overrides}), FSDPConfig(), get_platform("cpu"), DistInfo())


def nll(outputs, micro):
    mask = micro["response_mask"].to(outputs["log_probs"].dtype)
    return -(outputs["log_probs"] * mask).sum() / micro.meta["global_tokens"], {}


def adapter(engine) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in assemble(engine.export_adapter(torch.float64, 1 << 12))}


def base_weights(model_path) -> dict[str, torch.Tensor]:
    return {k: v.double() for k, v in load_file(str(model_path / "model.safetensors")).items()}


@pytest.fixture(scope="module")
def hf64(tiny_model_path):
    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float64)


def reference_training(
    hf64, start: dict[str, torch.Tensor], data, spec: EngineSpec
) -> dict[str, torch.Tensor]:
    """``STEPS`` AdamW steps on ``A``/``B`` of a plain float64 model whose adapted weights are
    ``W + scale * B A``; returns the adapter as the engine names it."""
    leaves = {name: t.clone().requires_grad_(True) for name, t in start.items()}
    modules = sorted({name.rsplit(".lora_", 1)[0] for name in leaves})
    params = dict(hf64.named_parameters())
    optimizer = torch.optim.AdamW(
        leaves.values(), lr=spec.lr, betas=spec.betas, weight_decay=spec.weight_decay
    )

    class Merged(torch.nn.Module):  # the model with merged weights, as a callable row_log_probs can use
        def __call__(self, ids):
            merged = {
                f"{m}.weight": params[f"{m}.weight"]
                + spec.lora.scale * leaves[f"{m}.lora_B.weight"] @ leaves[f"{m}.lora_A.weight"]
                for m in modules
            }
            return torch.func.functional_call(hf64, merged, (ids,))

    merged_model = Merged()
    total = int(data["response_mask"].sum())
    for _ in range(STEPS):
        for i in range(len(data)):
            lp, _ = row_log_probs(merged_model, data, i, spec.temperature)
            (-lp.sum() / total).backward()
        optimizer.step()
        optimizer.zero_grad()
    return {name: t.detach() for name, t in leaves.items()}


def test_a_fresh_adapter_computes_the_base_model(tiny_model_path):
    data = batch()
    plain = make(tiny_model_path, lora=None).infer(data, ["log_probs"])["log_probs"]
    out = make(tiny_model_path).infer(data, ["log_probs", "base_log_probs"])
    assert torch.equal(out["log_probs"], plain) and torch.equal(out["base_log_probs"], plain)


def test_training_moves_only_the_adapter_as_a_float64_loop_does(tiny_model_path, hf64):
    engine = make(tiny_model_path)
    start = adapter(engine)
    assert sorted({n.split(".")[-3] for n in start}) == ["down_proj", "q_proj", "v_proj"]
    assert all(not t.any() for n, t in start.items() if "lora_B" in n)  # B starts at zero
    data = batch()
    data.meta["global_tokens"] = int(data["response_mask"].sum())
    for _ in range(STEPS):
        engine.train_step(data, nll)

    # The frozen base: every tensor of the model folder, bit for bit (read back with the adapter off).
    want = base_weights(tiny_model_path)
    state = engine.module.hf.state_dict()
    for name, tensor in want.items():
        for key in (name, name.replace(".weight", ".base_layer.weight")):
            if key in state:
                assert torch.equal(state[key].full_tensor().cpu(), tensor), key
    # The adapter: changed, and exactly as the plain loop trains it.
    got = adapter(engine)
    assert all(t.abs().max() > 1e-4 for n, t in got.items() if "lora_B" in n)
    reference = reference_training(hf64, start, data, engine.spec)
    for name, tensor in reference.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=1e-10, msg=name)


def test_base_log_probs_are_the_reference_model_and_merged_weights_the_trained_one(
    tiny_model_path, hf64, tmp_path
):
    from fsdp_support import hf_reference
    from peft import PeftModel

    engine = make(tiny_model_path)
    data = batch()
    data.meta["global_tokens"] = int(data["response_mask"].sum())
    for _ in range(STEPS):
        engine.train_step(data, nll)
    out = engine.infer(data, ["log_probs", "base_log_probs"])
    base_lp, _ = hf_reference(hf64, data, TEMPERATURE)
    torch.testing.assert_close(out["base_log_probs"], base_lp, rtol=0, atol=1e-10)
    assert (out["log_probs"] - base_lp).abs().max() > 1e-3  # the adapter moved the policy

    engine.export_hf(str(tmp_path / "export"))
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "export", dtype=torch.float64)
    torch.testing.assert_close(
        out["log_probs"], hf_reference(merged, data, TEMPERATURE)[0], rtol=0, atol=1e-10
    )

    folder = tmp_path / "export" / "adapter"
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0
    assert sorted(config["target_modules"]) == ["down_proj", "q_proj", "v_proj"]
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float64)
    peft_model = PeftModel.from_pretrained(base, folder).eval()
    torch.testing.assert_close(
        hf_reference(peft_model, data, TEMPERATURE)[0], out["log_probs"], rtol=0, atol=1e-10
    )


def test_merged_stream_names_are_the_base_models(tiny_model_path):
    engine = make(tiny_model_path)
    names = [name for name, _ in assemble(engine.export_weights(torch.float32, 1 << 20))]
    assert sorted(set(names) - {"lm_head.weight"}) == sorted(base_weights(tiny_model_path))


def test_a_checkpoint_holds_the_adapter_and_resumes_it(tiny_model_path, tmp_path):
    data = batch()
    data.meta["global_tokens"] = int(data["response_mask"].sum())
    engine = make(tiny_model_path)
    engine.train_step(data, nll)
    engine.save_checkpoint(str(tmp_path / "ckpt"))
    size = sum(f.stat().st_size for f in (tmp_path / "ckpt").iterdir())
    model_bytes = (tiny_model_path / "model.safetensors").stat().st_size
    assert size < model_bytes / 4, (size, model_bytes)  # adapter and its Adam moments, not the base

    resumed = make(tiny_model_path)
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    for e in (engine, resumed):
        e.train_step(data, nll)
    a, b = adapter(engine), adapter(resumed)
    for name in a:
        assert torch.equal(a[name], b[name]), name

    with pytest.raises(ValueError, match=r"actor\.lora\.rank=4.*actor\.lora\.rank=8"):
        make(tiny_model_path, lora=LoraSpec(rank=8)).load_checkpoint(str(tmp_path / "ckpt"))
    with pytest.raises(ValueError, match=r"actor\.lora\.rank=0"):
        make(tiny_model_path, lora=None).load_checkpoint(str(tmp_path / "ckpt"))


def test_adapter_outputs_need_an_adapter(tiny_model_path):
    engine = make(tiny_model_path, lora=None)
    with pytest.raises(ValueError, match="need a LoRA adapter"):
        engine.infer(batch(), ["base_log_probs"])
    with pytest.raises(RuntimeError, match="no LoRA adapter"):
        next(iter(engine.export_adapter(torch.float32, 1 << 20)))


def test_unknown_target_modules_name_the_setting(tiny_model_path):
    with pytest.raises(ValueError, match=r"actor\.lora\.target_modules"):
        make(tiny_model_path, lora=LoraSpec(rank=4, target_modules=("no_such_proj",)))

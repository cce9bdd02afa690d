"""LoRA on the megatron engine at TP=2, against PEFT on the Hugging Face model (an independent
implementation of the same adapters): the adapter streamed after each of two AdamW steps, the log-probs
with and without it, the merged weights from the float64 formula, checkpoints, and an adapter on some
projections of the fused layers only."""

from __future__ import annotations

import copy

import mcore_lora_workers
import pytest
import torch
import torch.nn.functional as F
from mcore_test_workers import ADAM_EPS
from mcore_testlib import ATOL, hf_model, hf_response_outputs, make_batch, spawn

pytestmark = pytest.mark.distributed

RANK, ALPHA = mcore_lora_workers.RANK, mcore_lora_workers.ALPHA


@pytest.fixture(scope="module")
def batches():
    return make_batch(1, 1024), make_batch(2, 1024)


@pytest.fixture(scope="module")
def ranks(tiny_qwen, batches, tmp_path_factory):
    work = tmp_path_factory.mktemp("megatron_lora")
    spawn(mcore_lora_workers.tp2, 2, str(tiny_qwen), batches, str(work))
    results = [torch.load(work / f"lora_tp2_rank{r}.pt", weights_only=False) for r in range(2)]
    assert [r["holds"] for r in results] == [True, False]
    return results[0], work


@pytest.fixture(scope="module")
def qwen(tiny_qwen):
    return hf_model(tiny_qwen)


def _peft(model, adapter, targets="all-linear"):
    """A PEFT LoRA model over a copy of ``model`` holding ``adapter`` (HF/PEFT names)."""
    from peft import LoraConfig, inject_adapter_in_model

    model = copy.deepcopy(model)
    config = LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=targets, lora_dropout=0.0, bias="none")
    inject_adapter_in_model(config, model)
    modules = dict(model.named_modules())
    seen = set()
    with torch.no_grad():
        for name, tensor in adapter.items():
            module, part, _ = name.rsplit(".", 2)  # <module>.lora_A.weight
            getattr(modules[module], part)["default"].weight.copy_(tensor)
            seen.add(module)
    adapted = {n for n, m in modules.items() if hasattr(m, "lora_A") and "default" in m.lora_A}
    assert seen == adapted, f"the stream adapts {sorted(seen ^ adapted)[:4]} unlike PEFT"
    for name, param in model.named_parameters():
        param.requires_grad_(".lora_A." in name or ".lora_B." in name)
    return model


def _peft_adapter(model) -> dict[str, torch.Tensor]:
    return {
        name.replace(".default.weight", ".weight"): p.detach().clone()
        for name, p in model.named_parameters()
        if ".lora_A." in name or ".lora_B." in name
    }


def _adamw_steps(model, batches):
    """Two AdamW steps of the NLL on the trainable parameters, with the engine's optimiser settings
    (mcore_test_workers._engine: lr 1e-3, weight decay 0.01 on matrices, clipping at 1)."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=ADAM_EPS, weight_decay=0.01)
    adapters = []
    for batch in batches:
        width = batch["responses"].shape[1]
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits[:, -width - 1 : -1]
        logp = F.log_softmax(logits.float(), -1).gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
        loss = -(logp * batch["response_mask"]).sum() / batch.meta["global_tokens"]
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        adapters.append(_peft_adapter(model))
    return adapters


def test_the_adapter_trains_as_peft_does(ranks, qwen, batches):
    """The fresh adapter loads into PEFT's layers name for name; from it, two PEFT AdamW steps give the
    adapters the TP=2 engine streamed after its two steps (B alone moves at step 1: B starts at zero, so A
    gets no gradient; at step 2 A's gradient crosses the tensor-parallel sum)."""
    result, _ = ranks
    assert all(n.endswith((".lora_A.weight", ".lora_B.weight")) for n in result["adapter0"])
    assert not any(t.abs().max() for n, t in result["adapter0"].items() if ".lora_B." in n)
    reference = _adamw_steps(_peft(qwen, result["adapter0"]), batches)
    for step, theirs in enumerate(reference, 1):
        ours = result[f"adapter{step}"]
        assert set(ours) == set(theirs)
        for name, tensor in theirs.items():
            torch.testing.assert_close(ours[name], tensor, rtol=0, atol=1e-5, msg=f"step {step}: {name}")
    moved = [
        n for n in reference[1] if ".lora_A." in n and not torch.equal(reference[1][n], result["adapter0"][n])
    ]
    assert moved, "no A moved at step 2: the test would not see its gradient"


def test_log_probs_with_and_without_the_adapter_are_peft_and_the_base(ranks, qwen, batches):
    result, _ = ranks
    b1, _ = batches
    mask = b1["response_mask"].bool()
    adapted, _ = hf_response_outputs(_peft(qwen, result["adapter2"]).double(), b1)
    base, _ = hf_response_outputs(qwen.double(), b1)
    out = result["infer2"]
    torch.testing.assert_close(out["log_probs"].double()[mask], adapted[mask], rtol=0, atol=ATOL)
    torch.testing.assert_close(out["base_log_probs"].double()[mask], base[mask], rtol=0, atol=ATOL)
    assert float((adapted - base)[mask].abs().max()) > 1e-3  # the adapter changed the log-probs


def test_merged_weights_are_the_float64_formula(ranks, qwen):
    """``export_weights`` with an adapter: ``W + (alpha / r) B A`` for every adapted projection, the base
    weights elsewhere, computed here in float64 from the streamed adapter."""
    result, _ = ranks
    adapter, merged = result["adapter2"], result["merged2"]
    base = qwen.state_dict()
    assert set(merged) == set(base)
    adapted = {n.removesuffix(".lora_A.weight") for n in adapter if n.endswith(".lora_A.weight")}
    assert len(adapted) == 7 * qwen.config.num_hidden_layers
    for name, weight in base.items():
        module = name.removesuffix(".weight")
        want = weight.double()
        if module in adapted:
            a, b = adapter[f"{module}.lora_A.weight"], adapter[f"{module}.lora_B.weight"]
            want = want + (ALPHA / RANK) * (b.double() @ a.double())
        torch.testing.assert_close(merged[name].double(), want, rtol=0, atol=1e-6, msg=name)


def test_a_checkpoint_keeps_each_ranks_part_and_refuses_another_lora_setting(ranks):
    result, _ = ranks
    for name, tensor in result["adapter2"].items():
        assert torch.equal(result["adapter2_reloaded"][name], tensor), name
    assert (
        "written with actor.lora.rank=4, but this run has actor.lora.rank=0" in result["full_from_lora_error"]
    )


def test_export_hf_writes_the_merged_model_and_a_peft_adapter(ranks, qwen, batches):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    result, work = ranks
    b1, _ = batches
    mask = b1["response_mask"].bool()
    merged = AutoModelForCausalLM.from_pretrained(work / "hf", dtype=torch.float64)
    on_base = PeftModel.from_pretrained(copy.deepcopy(qwen).double(), str(work / "hf" / "adapter"))
    want = result["infer2"]["log_probs"].double()[mask]
    for model in (merged, on_base):
        got, _ = hf_response_outputs(model, b1)
        torch.testing.assert_close(got[mask], want, rtol=0, atol=ATOL)


def test_an_adapter_on_some_projections_of_the_fused_layers(ranks, qwen, batches):
    """``target_modules: [q_proj, v_proj]``: the stream holds those two only and trains as PEFT's; the
    merged k_proj and the MLP are the base weights exactly."""
    result, _ = ranks
    adapter, merged = result["some_adapter2"], result["some_merged2"]
    assert {n.rsplit(".", 3)[-3] for n in adapter} == {"q_proj", "v_proj"}
    base = qwen.state_dict()
    for name, weight in base.items():
        if "k_proj" in name or "mlp" in name or "o_proj" in name:
            assert torch.equal(merged[name], weight), name
    assert any(not torch.equal(merged[n], base[n]) for n in merged if "v_proj" in n)

"""MegatronEngine at TP=PP=DP=1 (one gloo process) against the Hugging Face model on the same weights.

One spawned worker (``mcore_test_workers.world1``) runs every engine call; the tests here check its
results against references computed in this process with plain transformers + torch.
"""

from __future__ import annotations

import json

import mcore_test_workers
import pytest
import torch
from mcore_testlib import (
    ATOL,
    assert_same_weights,
    hf_model,
    hf_response_outputs,
    make_batch,
    spawn,
)


@pytest.fixture(scope="module")
def run(tiny_qwen, tiny_llama, tmp_path_factory):
    work = tmp_path_factory.mktemp("megatron_world1")
    batches = (make_batch(1, 1024), make_batch(2, 1024), make_batch(3, 1000))
    spawn(mcore_test_workers.world1, 1, str(tiny_qwen), str(tiny_llama), batches, str(work))
    return torch.load(work / "world1_rank0.pt", weights_only=False), batches, work


@pytest.fixture(scope="module")
def qwen(tiny_qwen):
    return hf_model(tiny_qwen)


def test_export_gives_back_the_hf_weights_bit_exactly(run, qwen):
    results, _, _ = run
    assert_same_weights(results["export0"], qwen.state_dict())


def test_log_probs_and_entropy_equal_hf(run, qwen):
    results, (b1, _, _), _ = run
    ref_logp, ref_entropy = hf_response_outputs(qwen, b1)
    mask = b1["response_mask"].bool()
    out = results["infer0"]
    assert out["log_probs"].shape == b1["responses"].shape
    torch.testing.assert_close(out["log_probs"].double()[mask], ref_logp[mask], rtol=0, atol=ATOL)
    torch.testing.assert_close(out["entropy"].double()[mask], ref_entropy[mask], rtol=0, atol=ATOL)


def test_train_step_matches_one_hf_adamw_step(run, qwen):
    results, (b1, _, _), _ = run
    loss, grad_norm, after = mcore_test_workers.hf_step(qwen, b1)
    metrics = results["metrics1"]
    assert metrics["loss"] == pytest.approx(loss, abs=ATOL)
    assert metrics["grad_norm"] == pytest.approx(grad_norm, rel=1e-4)
    assert metrics["lr"] == pytest.approx(1e-3)
    assert_same_weights(results["export1"], after, atol=1e-6)
    # The step really moved the weights (by about lr), so the comparison above is not vacuous.
    moved = max((after[k] - v).abs().max() for k, v in qwen.state_dict().items())
    assert moved > 5e-4


def test_gradient_checkpointing_changes_nothing_numerically(run):
    results, _, _ = run
    assert results["metrics1_recompute"] == results["metrics1"]
    assert_same_weights(results["export1_recompute"], results["export1"])


def test_release_frees_device_storage_and_resume_restores_it(run):
    results, _, _ = run
    assert results["released_bytes"] == 0
    assert "released" in results["released_error"] and "resume" in results["released_error"]
    assert torch.equal(results["infer1_resumed"]["log_probs"], results["infer1"]["log_probs"])


def test_checkpoint_resumes_optimizer_and_schedule_exactly(run):
    results, _, _ = run
    # A fresh engine loaded from the step-1 checkpoint takes step 2 exactly as the original did.
    assert results["steps_reloaded"] == 1
    assert results["metrics2_reloaded"] == results["metrics2"]
    assert results["metrics2"]["lr"] < 1e-3  # the cosine schedule advanced and was restored
    assert_same_weights(results["export2_reloaded"], results["export2"])


def test_a_checkpoint_with_a_planted_pickle_is_refused_and_never_run(run):
    results, _, _ = run
    assert set(results["planted"]) == {".metadata", "common.pt"}
    for name, got in results["planted"].items():
        assert (got["error"] or "").startswith(f"UnsafeCheckpointError: refusing to load {got['file']}:"), (
            name
        )
        assert not got["ran"], name


def test_export_hf_writes_a_folder_transformers_loads(run):
    results, _, work = run
    exported = hf_model(work / "hf_export")
    assert exported.config.tie_word_embeddings
    assert_same_weights(exported.state_dict(), results["export2_reloaded"])
    assert (work / "hf_export" / "tokenizer.json").exists()
    config = json.loads((work / "hf_export" / "config.json").read_text())
    assert config["dtype"] == "float32" and "torch_dtype" not in config


def test_value_head_gives_per_token_values_and_trains(run, qwen, tiny_qwen):
    results, (b1, _, _), _ = run
    values = results["values"]["values"]
    assert values.shape == b1["responses"].shape
    weights = results["critic_export0"]
    assert weights["score.weight"].shape == (1, qwen.config.hidden_size) and not weights["score.bias"].any()
    # Reference: HF's final hidden states through the exported head.
    width = b1["responses"].shape[1]
    hidden = qwen.model(
        input_ids=b1["input_ids"], attention_mask=b1["attention_mask"], position_ids=b1["position_ids"]
    ).last_hidden_state[:, -width - 1 : -1]
    ref = (hidden @ weights["score.weight"].T + weights["score.bias"]).squeeze(-1)
    mask = b1["response_mask"].bool()
    torch.testing.assert_close(values[mask], ref[mask].detach(), rtol=0, atol=ATOL)
    assert results["critic_metrics"]["loss"] > 0
    assert not torch.equal(results["critic_export1"]["score.weight"], weights["score.weight"])


def test_llama_round_trips_and_matches_hf(run, tiny_llama):
    results, (_, _, batch), _ = run
    llama = hf_model(tiny_llama)
    assert_same_weights(results["llama_export"], llama.state_dict())
    ref_logp, ref_entropy = hf_response_outputs(llama, batch)
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(
        results["llama_infer"]["log_probs"].double()[mask], ref_logp[mask], rtol=0, atol=ATOL
    )
    torch.testing.assert_close(
        results["llama_infer"]["entropy"].double()[mask], ref_entropy[mask], rtol=0, atol=ATOL
    )


def test_bf16_with_the_plain_optimizer_trains_and_resumes_exactly(run):
    results, _, _ = run
    assert results["bf16_metrics1"]["loss"] == pytest.approx(results["metrics1"]["loss"], abs=0.02)
    assert results["bf16_metrics2_reloaded"] == results["bf16_metrics2"]
    assert_same_weights(results["bf16_export2_reloaded"], results["bf16_export2"])


def test_score_head_reads_the_last_real_token(run, qwen):
    results, (b1, _, _), _ = run
    weight = results["reward_export"]["score.weight"]
    hidden = qwen.model(
        input_ids=b1["input_ids"], attention_mask=b1["attention_mask"], position_ids=b1["position_ids"]
    ).last_hidden_state
    last = b1["attention_mask"].shape[1] - 1 - b1["attention_mask"].flip(1).argmax(1)  # last real column
    ref = (hidden[torch.arange(len(b1)), last] @ weight.T).squeeze(-1)
    torch.testing.assert_close(results["scores"]["scores"], ref.detach(), rtol=0, atol=ATOL)

"""MegatronEngine on two gloo ranks: TP=2, PP=2 and DP=2 in turn, against the Hugging Face model.

TP=2 gathers split weights (fused QKV per query group, gate/up per rank, vocabulary rows); PP=2 runs
Megatron's 1F1B schedule over gloo and walks stages on export; DP=2 shards the batch and must *sum*
gradients (each rank's loss is normalised by the global token count). All three must give HF's
numbers on the same weights.
"""

from __future__ import annotations

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

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def ranks(tiny_qwen, tiny_llama, tmp_path_factory):
    work = tmp_path_factory.mktemp("megatron_world2")
    batches = (make_batch(1, 1024), make_batch(2, 1024), make_batch(3, 1000))
    spawn(mcore_test_workers.world2, 2, str(tiny_qwen), str(tiny_llama), batches, str(work))
    return [torch.load(work / f"world2_rank{r}.pt", weights_only=False) for r in range(2)], batches


@pytest.fixture(scope="module")
def qwen(tiny_qwen):
    return hf_model(tiny_qwen)


@pytest.fixture(scope="module")
def hf_step(qwen):
    return mcore_test_workers.hf_step(qwen, make_batch(1, 1024))


@pytest.mark.parametrize(("layout", "holder"), [("tp2", 0), ("pp2", 1)])
def test_only_the_holding_rank_returns_outputs_and_weights(ranks, layout, holder):
    results, _ = ranks
    assert [r[f"{layout}_holds"] for r in results] == [holder == 0, holder == 1]
    other = results[1 - holder]
    assert other[f"{layout}_infer"] is None and other[f"{layout}_export0"] == {}


@pytest.mark.parametrize(("layout", "holder"), [("tp2", 0), ("pp2", 1)])
def test_export_gathers_the_hf_weights_bit_exactly(ranks, qwen, layout, holder):
    results, _ = ranks
    assert_same_weights(results[holder][f"{layout}_export0"], qwen.state_dict())


@pytest.mark.parametrize(("layout", "holder"), [("tp2", 0), ("pp2", 1)])
def test_log_probs_and_entropy_equal_hf(ranks, qwen, layout, holder):
    results, (b1, _, _) = ranks
    ref_logp, ref_entropy = hf_response_outputs(qwen, b1)
    mask = b1["response_mask"].bool()
    out = results[holder][f"{layout}_infer"]
    torch.testing.assert_close(out["log_probs"].double()[mask], ref_logp[mask], rtol=0, atol=ATOL)
    torch.testing.assert_close(out["entropy"].double()[mask], ref_entropy[mask], rtol=0, atol=ATOL)


@pytest.mark.parametrize(("layout", "holder"), [("tp2", 0), ("pp2", 1), ("dp2", 0)])
def test_train_step_matches_one_hf_adamw_step(ranks, hf_step, layout, holder):
    results, _ = ranks
    loss, grad_norm, after = hf_step
    metrics = [r[f"{layout}_metrics"] for r in results]
    assert metrics[0] == metrics[1]  # every rank reports the same metrics
    assert metrics[0]["loss"] == pytest.approx(loss, abs=ATOL)
    assert metrics[0]["grad_norm"] == pytest.approx(grad_norm, rel=1e-4)
    assert_same_weights(results[holder][f"{layout}_export1"], after, atol=1e-6)


def test_data_parallel_ranks_and_identical_replicas(ranks):
    results, _ = ranks
    assert [r["dp2_dp"] for r in results] == [(0, 2), (1, 2)]
    assert [r["tp2_dp"] for r in results] == [(0, 1), (0, 1)]
    assert_same_weights(results[0]["dp2_export1"], results[1]["dp2_export1"])


def test_llama_with_padded_vocabulary_split_over_two_ranks(ranks, tiny_llama):
    results, (_, _, batch) = ranks
    llama = hf_model(tiny_llama)
    assert_same_weights(results[0]["tp2_llama_export"], llama.state_dict())
    ref_logp, ref_entropy = hf_response_outputs(llama, batch)
    mask = batch["response_mask"].bool()
    out = results[0]["tp2_llama_infer"]
    torch.testing.assert_close(out["log_probs"].double()[mask], ref_logp[mask], rtol=0, atol=ATOL)
    torch.testing.assert_close(out["entropy"].double()[mask], ref_entropy[mask], rtol=0, atol=ATOL)


def test_pipeline_hand_offs_never_synchronize_the_device(ranks, qwen, hf_step):
    """PP=2 inference and a training step over micro-batches of different lengths (two of 11 and 9 tokens a
    row; then four single rows of 11, 6, 9 and 5 tokens): each stage computes every hand-off's shape
    (``rlcore_megatron.handoffs``) and waits on its requests only, so megatron-core neither exchanges
    shapes nor synchronizes the device at a hand-off, and the results still equal HF's."""
    results, (b1, _, _) = ranks
    assert [r["pp2_device_syncs"] for r in results] == [{}, {}]
    assert [r["pp2_mb1_device_syncs"] for r in results] == [{}, {}]
    ref_logp, _ = hf_response_outputs(qwen, b1)
    mask = b1["response_mask"].bool()
    out = results[1]["pp2_mb1_infer"]
    torch.testing.assert_close(out["log_probs"].double()[mask], ref_logp[mask], rtol=0, atol=ATOL)
    loss, grad_norm, _ = hf_step
    assert results[1]["pp2_mb1_metrics"]["loss"] == pytest.approx(loss, abs=ATOL)
    assert results[1]["pp2_mb1_metrics"]["grad_norm"] == pytest.approx(grad_norm, rel=1e-4)


def test_each_micro_batch_is_built_when_the_schedule_runs_it(ranks):
    """A step builds micro-batch ``k+1``'s inputs after it launched ``k`` (so the host's work on them
    overlaps the device's), not all of them before the first: on both PP=2 stages, for the inference and
    the training step of four micro-batches each, builds and forwards alternate."""
    results, _ = ranks
    for r in results:
        assert r["pp2_mb1_order"] == ["build", "run"] * 8

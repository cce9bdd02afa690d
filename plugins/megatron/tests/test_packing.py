"""``megatron.use_remove_padding``: each micro-batch's sequences packed into one row (Megatron's ``thd``
layout) with rlcore's var-len core attention in the local layer spec.

The packed engine's log-probs are checked against the Hugging Face model (an independent reference) at
TP=1, TP=2 and PP=2, and its training step (loss, gradients, updated weights) against the padded path's
on the same batch. A packed attention that lets sequences see each other is shown to fail the reference
check, so the check can catch a wrong mask.
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
from rlcore.api import Batch
from rlcore_megatron.config import MegatronConfig
from rlcore_megatron.sequences import left_align, micro_batch_rows, micro_batches, pack, split_to_count


def batch():
    """Four rows of 11, 6, 9 and 5 real tokens (left-padded prompts, right-padded responses)."""
    return make_batch(1, 1024)


@pytest.fixture(scope="module")
def qwen(tiny_qwen):
    return hf_model(tiny_qwen)


@pytest.fixture(scope="module")
def hf_step(qwen):
    """``(loss, grad_norm, weights after)`` of one HF AdamW step on :func:`batch`, as the workers train."""
    return mcore_test_workers.hf_step(qwen, batch())


def run_ranks(worker, world: int, tiny_qwen, tmp_path_factory) -> list[dict]:
    """``worker`` of :mod:`mcore_test_workers` in ``world`` processes on :func:`batch`: each rank's results."""
    name = worker.__name__
    work = tmp_path_factory.mktemp(f"megatron_{name}{world}")
    spawn(worker, world, str(tiny_qwen), batch(), str(work))
    return [torch.load(work / f"{name}_rank{r}.pt", weights_only=False) for r in range(world)]


@pytest.fixture(scope="module")
def one(tiny_qwen, tmp_path_factory):
    return run_ranks(mcore_test_workers.packed1, 1, tiny_qwen, tmp_path_factory)[0]


@pytest.fixture(scope="module")
def two(tiny_qwen, tmp_path_factory):
    return run_ranks(mcore_test_workers.packed2, 2, tiny_qwen, tmp_path_factory)


def assert_equal_hf(out, qwen, atol=ATOL, b: Batch | None = None):
    b = batch() if b is None else b
    ref_logp, ref_entropy = hf_response_outputs(qwen, b)
    mask = b["response_mask"].bool()
    assert out["log_probs"].shape == b["responses"].shape
    torch.testing.assert_close(out["log_probs"].double()[mask], ref_logp[mask], rtol=0, atol=atol)
    torch.testing.assert_close(out["entropy"].double()[mask], ref_entropy[mask], rtol=0, atol=atol)


# -- packing itself (no Megatron) ------------------------------------------------------------------
def test_pack_drops_padding_and_restarts_positions():
    b = batch()
    aligned = left_align(b["input_ids"], b["attention_mask"])
    packed = pack(aligned)
    lengths = [11, 6, 9, 5]
    assert aligned.lengths.tolist() == lengths
    assert packed.cu_seqlens.tolist() == [0, 11, 17, 26, 31] and packed.max_seqlen == 11
    assert packed.cu_seqlens.dtype == torch.int32
    assert packed.cu_seqlens_host.device.type == "cpu" and torch.equal(
        packed.cu_seqlens_host, packed.cu_seqlens
    )
    real = [row[row != 0] for row in b["input_ids"]]  # make_batch draws real tokens >= 3
    assert packed.tokens[0].tolist() == torch.cat(real).tolist()
    assert packed.position_ids[0].tolist() == [p for n in lengths for p in range(n)]
    nxt = packed.next_tokens()[0]
    assert nxt.tolist() == [t for r in real for t in [*r[1:].tolist(), 0]]
    # unpack puts packed values back on the aligned positions of each row
    values = torch.arange(31.0)[None, :, None]
    back = packed.unpack(values, aligned)[..., 0]
    for row, (start, n) in enumerate(zip([0, 11, 17, 26], lengths, strict=True)):
        assert back[row, :n].tolist() == list(range(start, start + n))


def test_pack_of_empty_rows_keeps_shapes_non_empty():
    aligned = left_align(torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long))
    packed = pack(aligned)
    assert packed.tokens.shape == (1, 1) and packed.cu_seqlens.tolist() == [0, 0, 0, 1]
    assert packed.cu_seqlens_host.tolist() == [0, 0, 0, 1]
    assert packed.next_tokens().tolist() == [[0]]


def test_packed_micro_batches_are_cut_by_real_tokens():
    b = batch()  # real lengths 11, 6, 9, 5
    padded = [len(mb) for mb in micro_batches(b, 4, max_tokens=18)]
    packed = [len(mb) for mb in micro_batches(b, 4, max_tokens=18, packed=True)]
    assert padded == [1, 2, 1] and packed == [2, 2]  # 11 | 6+9 (2x9) | 5 against 11+6 | 9+5
    assert [len(mb) for mb in micro_batches(Batch(b.tensors), 4, max_tokens=4, packed=True)] == [1] * 4


def test_packed_micro_batches_are_token_balanced():
    """Rows of 12, 12, 6 and 6 tokens under a budget of 18: cut in order they take three micro-batches
    (12 | 12+6 | 6); planned as the FSDP engine plans them, two full ones, rows out of order. A row over
    the budget still goes alone."""
    assert micro_batch_rows([12, 12, 6, 6], 4, 18, packed=True) == [[0, 2], [1, 3]]
    assert micro_batch_rows([12, 30, 6, 6], 4, 18, packed=True) == [[0], [1], [2, 3]]  # loads 12 | 30 | 12
    assert micro_batch_rows([12, 12, 6, 6], 4, 18) == [[0], [1], [2, 3]]  # padded: rows x longest


def test_config_default_off_and_refused_with_transformer_engine():
    assert MegatronConfig().use_remove_padding is False
    with pytest.raises(ValueError, match="transformer_impl=local"):
        MegatronConfig(use_remove_padding=True, transformer_impl="transformer_engine")


def test_kept_logits_are_accepted_with_and_without_tensor_parallelism():
    assert MegatronConfig().recompute_logits is True
    assert MegatronConfig(recompute_logits=False).recompute_logits is False  # TP=1: the fused head
    # TP > 1: the vocabulary-parallel head keeps each rank's slice
    assert MegatronConfig(recompute_logits=False, tensor_model_parallel_size=2).recompute_logits is False


# -- the engine, one process -----------------------------------------------------------------------
def test_packed_log_probs_and_entropy_equal_hf(one, qwen):
    assert_equal_hf(one["packed_infer"], qwen)
    assert_equal_hf(one["packed_tokens_infer"], qwen)  # micro-batches cut by tokens


def test_no_layer_reads_the_device_boundaries_on_the_host(one):
    """On a GPU each ``tolist``/``item`` of the device ``cu_seqlens`` is a sync: the attention fallback
    reads the host copy instead, and nothing else reads them."""
    reads = one["host_reads"]
    assert reads["device"] == 0, reads
    assert reads["host"] >= 2, reads  # the spy sees them: the fallback, in each of the two layers


def test_a_forward_does_no_work_per_sequence_outside_attention(one):
    """Host time per layer must not grow with the sequences in a pack (megatron-core's own packed rotary
    ran ~100 operators per sequence and layer: the device sat idle 83% of a 0.5B step on an H200). With
    an attention whose work does not depend on them, a pack of 3 sequences dispatches exactly the
    operators of a pack of 2 (megatron-core 0.16's packed rotary, the CPU's, fails this: one more per layer for queries and keys)."""
    ops = one["forward_ops"]
    assert ops[2] > 50, ops  # the counter sees the forward
    assert ops[3] == ops[2], ops


def test_attending_across_sequences_would_fail_the_hf_check(one, qwen):
    """The same packed engine with attention over the whole pack (positions still per sequence):
    the rows packed after another row move far outside the tolerance, so the check above can fail."""
    b = batch()
    ref_logp, _ = hf_response_outputs(qwen, b)
    mask = b["response_mask"].bool()
    diff = (one["leaky_infer"]["log_probs"].double() - ref_logp).abs().where(mask, 0).amax(1)
    # micro-batches of 3 and 1 rows: rows 1 and 2 follow another sequence in their pack
    assert diff[1] > 100 * ATOL and diff[2] > 100 * ATOL
    assert diff[0] < ATOL and diff[3] < ATOL
    with pytest.raises(AssertionError):
        assert_equal_hf({**one["packed_infer"], "log_probs": one["leaky_infer"]["log_probs"]}, qwen)


def test_packed_train_step_equals_padded(one):
    """Loss, gradient norm, every gradient and the updated weights: packing changes nothing but the
    summation order inside attention."""
    assert one["packed_metrics"]["loss"] == pytest.approx(one["padded_metrics"]["loss"], abs=1e-6)
    assert one["packed_metrics"]["grad_norm"] == pytest.approx(one["padded_metrics"]["grad_norm"], rel=1e-6)
    assert one["packed_metrics"]["lr"] == one["padded_metrics"]["lr"]
    assert_same_weights(one["packed_grads"], one["padded_grads"], atol=1e-6)
    assert max(g.abs().max() for g in one["padded_grads"].values()) > 1e-2  # not vacuous
    assert_same_weights(one["packed_export1"], one["padded_export1"], atol=1e-6)


def test_packed_value_and_score_heads_equal_padded(one):
    mask = batch()["response_mask"].bool()
    torch.testing.assert_close(
        one["packed_values"]["values"][mask], one["padded_values"]["values"][mask], rtol=0, atol=ATOL
    )
    torch.testing.assert_close(
        one["packed_scores"]["scores"], one["padded_scores"]["scores"], rtol=0, atol=ATOL
    )
    critic = one["packed_critic_metrics"], one["padded_critic_metrics"]
    assert critic[0]["loss"] == pytest.approx(critic[1]["loss"], abs=1e-6)
    assert critic[0]["grad_norm"] == pytest.approx(critic[1]["grad_norm"], rel=1e-6)


def test_packed_train_step_matches_one_hf_adamw_step(one, hf_step):
    loss, grad_norm, after = hf_step
    assert one["packed_metrics"]["loss"] == pytest.approx(loss, abs=ATOL)
    assert one["packed_metrics"]["grad_norm"] == pytest.approx(grad_norm, rel=1e-4)
    assert_same_weights(one["packed_export1"], after, atol=1e-6)


# -- the engine, two ranks -------------------------------------------------------------------------
@pytest.mark.distributed
@pytest.mark.parametrize(("layout", "holder"), [("tp2", 0), ("pp2", 1)])
def test_packed_two_ranks_equal_hf(two, qwen, hf_step, layout, holder):
    assert two[1 - holder][f"{layout}_infer"] is None
    assert_equal_hf(two[holder][f"{layout}_infer"], qwen)
    loss, grad_norm, after = hf_step
    metrics = [r[f"{layout}_metrics"] for r in two]
    assert metrics[0] == metrics[1]
    assert metrics[0]["loss"] == pytest.approx(loss, abs=ATOL)
    assert metrics[0]["grad_norm"] == pytest.approx(grad_norm, rel=1e-4)
    assert_same_weights(two[holder][f"{layout}_export1"], after, atol=1e-6)


# -- compiled layers (megatron.compile) -------------------------------------------------------------
# TP=1 only: each layout compiles every layer three times from a cold cache (about 110 s on 2 cores), and
# the suite keeps under 45 minutes. TP=2 compiled runs in the GPU rows (megatron-tp2-*).
@pytest.fixture(scope="module", params=[1], ids=["tp1"])
def compiled(request, tiny_qwen, tmp_path_factory):
    return run_ranks(mcore_test_workers.compiled, request.param, tiny_qwen, tmp_path_factory)


def test_compiled_layers_equal_hf_and_train_as_hf(compiled, qwen, hf_step):
    """Every decoder layer compiled (the packed attention traced into it), the head chunked (at TP=1
    rlcore's fused head with its compiled kernels): log-probs and entropy against the HF model, and the
    training step against one HF AdamW step (TP=1)."""
    loss, grad_norm, after = hf_step
    for rank in compiled:
        assert rank["compiled_layers"] == rank["layers"] > 0
        assert rank["metrics"]["loss"] == pytest.approx(loss, abs=ATOL)
        assert rank["metrics"]["grad_norm"] == pytest.approx(grad_norm, rel=1e-4)
    assert_equal_hf(compiled[0]["infer"], qwen)
    assert_same_weights(compiled[0]["export1"], after, atol=1e-6)


def test_compiled_layers_trace_the_packed_attention(compiled, qwen):
    """With a var-len kernel dynamo can trace (PyTorch's flash kernel on a GPU; stood in for here), the
    packed attention and its rotary embedding are part of each compiled layer's graph: no graph breaks in
    the engine's first call (megatron-core warns once per process) nor in a training step (which traces
    the backward of megatron-core's linears too), and the outputs still match HF."""
    for rank in compiled:
        assert rank["graph_breaks"] == {}
        assert rank["train_graph_breaks"] == {}
    assert_equal_hf(compiled[0]["traced_infer"], qwen)


# -- the chunked head (megatron.logits_chunk_size) -------------------------------------------------
@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def chunked(request, tiny_qwen, tmp_path_factory):
    return run_ranks(mcore_test_workers.chunked, request.param, tiny_qwen, tmp_path_factory)


def test_chunked_head_equals_hf_and_trains_as_the_whole_head(chunked, qwen, hf_step):
    """Log-probs and entropy against the HF model; the training step (loss, gradient norm, every
    gradient, the updated weights) against the head over the whole micro-batch and one HF AdamW step, also
    with the logits kept from the forward (``recompute_logits=False``; at TP=2 each rank's slice)."""
    check_chunked(chunked, qwen, hf_step, batch())


def llama_batch():
    """:func:`batch` for the tiny Llama's vocabulary of 1,000."""
    return make_batch(1, 1000)


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def chunked_llama(request, tiny_llama, tmp_path_factory):
    work = tmp_path_factory.mktemp(f"megatron_chunked_llama{request.param}")
    spawn(mcore_test_workers.chunked, request.param, str(tiny_llama), llama_batch(), str(work))
    return [torch.load(work / f"chunked_rank{r}.pt", weights_only=False) for r in range(request.param)]


def test_chunked_head_of_an_untied_padded_output_layer(chunked_llama, tiny_llama):
    """The same checks on the tiny Llama: its output layer is its own matrix (as Qwen2.5-7B's), so the
    chunked head must project with it, not with the input embedding (megatron-core's
    ``shared_embedding_or_output_weight`` returns the embedding on a first stage, tied or not: the 7B
    shape's log-probs were 1.35 off on average), and its vocabulary of 1,000 is padded to 1,024 (at TP=2
    the second rank's slice ends in 24 padding rows, which must get no probability)."""
    llama = hf_model(tiny_llama)
    assert not torch.equal(llama.lm_head.weight, llama.model.embed_tokens.weight)
    check_chunked(chunked_llama, llama, mcore_test_workers.hf_step(llama, llama_batch()), llama_batch())


def check_chunked(chunked: list[dict], qwen, hf_step, b: Batch) -> None:
    loss, grad_norm, after = hf_step
    names = ("chunked", "chunked_packed", "chunked_kept")
    for rank in chunked:
        for name in names:
            if rank[f"{name}_infer"] is not None:  # the rank holding outputs (tensor-parallel rank 0)
                assert_equal_hf(rank[f"{name}_infer"], qwen, b=b)
            metrics, whole = rank[f"{name}_metrics"], rank["whole_metrics"]
            assert metrics["loss"] == pytest.approx(whole["loss"], abs=1e-6)
            assert metrics["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-6)
            assert metrics["loss"] == pytest.approx(loss, abs=ATOL)
            assert_same_weights(rank[f"{name}_grads"], rank["whole_grads"], atol=1e-6)
    for name in names:  # the weight stream comes from rank 0
        assert_same_weights(chunked[0][f"{name}_export1"], after, atol=1e-6)
    assert chunked[0]["chunked_infer"] is not None
    assert max(g.abs().max() for g in chunked[0]["whole_grads"].values()) > 1e-2  # not vacuous


def test_split_to_count_halves_the_heaviest_micro_batch_until_the_count():
    lengths = [9, 5, 4, 3, 8]
    # [0, 1, 2] holds 18 tokens, [3, 4] 11: the first is halved, longest row onto the lighter half.
    assert split_to_count([[0, 1, 2], [3, 4]], lengths, 3) == [[0], [1, 2], [3, 4]]
    assert split_to_count([[0, 1, 2], [3, 4]], lengths, 4) == [[0], [1, 2], [4], [3]]
    # Every row alone: no more cuts; the engine runs ghosts for the rest.
    assert split_to_count([[0], [1]], lengths, 4) == [[0], [1]]
    assert split_to_count([[0, 1]], lengths, 1) == [[0, 1]]

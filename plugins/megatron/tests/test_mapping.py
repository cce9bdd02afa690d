"""The HF <-> Megatron layouts, sequence alignment and vocab-parallel math, without process groups.

References are written out independently: explicit per-head loops for the fused QKV layout, HF's own
state-dict keys for name coverage, float64 ``log_softmax`` for log-probs.
"""

from __future__ import annotations

import pytest
import torch
from rlcore.api import Batch
from rlcore.kernels.logits import slice_kernels
from rlcore_megatron.architecture import model_shape
from rlcore_megatron.config import MegatronConfig
from rlcore_megatron.convert import param_maps, shard, to_hf, to_mcore, unshard
from rlcore_megatron.sequences import (
    input_shape,
    left_align,
    micro_batches,
    pack,
    response_columns,
    response_tokens,
    restore,
    to_device,
)
from rlcore_megatron.vocab_parallel import (
    chunked_log_probs_and_entropy,
    combine_slices,
    log_probs_and_entropy,
    slice_statistics,
)
from torch.utils.flop_counter import FlopCounterMode
from transformers import LlamaConfig, Qwen2Config


def qwen_config(**kw):
    base = dict(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=8,
        tie_word_embeddings=True,
    )
    return Qwen2Config(**{**base, **kw})


def shape_of(config, tp=1, pp=1, divisible=128):
    return model_shape(config, tp_size=tp, pp_size=pp, make_vocab_size_divisible_by=divisible)


def by_mcore(maps, name):
    return next(pm for pm in maps if pm.mcore == name)


def test_qkv_layout_interleaves_query_groups_like_megatron():
    shape = shape_of(qwen_config())
    d, groups, per_group = shape.head_dim, shape.num_kv_heads, shape.heads_per_group
    q = torch.randn(shape.num_heads * d, shape.hidden_size)
    k = torch.randn(groups * d, shape.hidden_size)
    v = torch.randn(groups * d, shape.hidden_size)
    pm = by_mcore(param_maps(shape), "decoder.layers.0.self_attention.linear_qkv.weight")
    fused = to_mcore(pm, [q, k, v], shape)

    # Megatron reads the fused rows per group: the group's query heads, then its key, then its value.
    rows = []
    for g in range(groups):
        for h in range(g * per_group, (g + 1) * per_group):
            rows.append(q[h * d : (h + 1) * d])
        rows.append(k[g * d : (g + 1) * d])
        rows.append(v[g * d : (g + 1) * d])
    assert torch.equal(fused, torch.cat(rows))
    assert all(torch.equal(a, b) for a, b in zip(to_hf(pm, fused, shape), [q, k, v], strict=True))


def hf_state_dict(config):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).state_dict()


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("tied", [True, False])
def test_hf_weights_round_trip_through_tensor_parallel_shards(tp, tied):
    config = qwen_config(tie_word_embeddings=tied)
    shape, sd = shape_of(config, tp=tp), hf_state_dict(config)
    for pm in param_maps(shape):
        tensors = [sd[n] for n in pm.hf]
        parts = [shard(pm, to_mcore(pm, tensors, shape), r, tp) for r in range(tp)]
        assert {p.shape for p in parts} == {parts[0].shape}, pm.mcore
        back = to_hf(pm, unshard(pm, parts), shape)
        assert all(torch.equal(a, b) for a, b in zip(back, tensors, strict=True)), pm.mcore


def test_gate_up_shards_hold_their_own_gate_and_up_rows():
    shape = shape_of(qwen_config(), tp=2)
    pm = by_mcore(param_maps(shape), "decoder.layers.1.mlp.linear_fc1.weight")
    gate = torch.randn(shape.ffn_hidden_size, shape.hidden_size)
    up = torch.randn(shape.ffn_hidden_size, shape.hidden_size)
    full = to_mcore(pm, [gate, up], shape)
    half = shape.ffn_hidden_size // 2
    assert torch.equal(shard(pm, full, 1, 2), torch.cat([gate[half:], up[half:]]))


def test_vocab_is_padded_with_zero_rows_to_a_tensor_parallel_multiple():
    shape = shape_of(qwen_config(), tp=2, divisible=64)
    assert shape.padded_vocab_size == 1024  # 1000 up to a multiple of 64 * 2
    pm = by_mcore(param_maps(shape), "embedding.word_embeddings.weight")
    weight = torch.randn(1000, shape.hidden_size)
    full = to_mcore(pm, [weight], shape)
    assert full.shape == (1024, shape.hidden_size) and not full[1000:].any()
    assert torch.equal(to_hf(pm, full, shape)[0], weight)


LLAMA = LlamaConfig(
    vocab_size=1000,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    tie_word_embeddings=False,
)


@pytest.mark.parametrize("config", [qwen_config(), qwen_config(tie_word_embeddings=False), LLAMA])
def test_maps_name_exactly_the_hf_state_dict(config):
    exported = {n for pm in param_maps(shape_of(config)) if pm.export for n in (*pm.hf, *pm.aliases)}
    assert exported == set(hf_state_dict(config))


def test_value_head_maps_to_hf_score_with_bias_and_reward_head_without():
    shape = shape_of(qwen_config())
    value = {pm.mcore: pm.hf for pm in param_maps(shape, head="value")}
    score = {pm.mcore: pm.hf for pm in param_maps(shape, head="score")}
    assert value["output_layer.weight"] == ("score.weight",) and value["output_layer.bias"] == ("score.bias",)
    assert score["output_layer.weight"] == ("score.weight",) and "output_layer.bias" not in score
    assert not any("lm_head" in n for pm in param_maps(shape, head="value") for n in (*pm.hf, *pm.aliases))


def test_fused_norm_names_for_transformer_engine_layers():
    names = {pm.mcore for pm in param_maps(shape_of(qwen_config()), fused_norms=True)}
    assert "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in names
    assert "decoder.layers.0.mlp.linear_fc1.layer_norm_weight" in names
    assert "decoder.layers.0.input_layernorm.weight" not in names


@pytest.mark.parametrize(
    ("config", "kw", "message"),
    [
        (qwen_config(), dict(tp=4), "must divide num_key_value_heads=2"),
        (qwen_config(), dict(pp=3), "must divide num_hidden_layers=2"),
        (qwen_config(use_sliding_window=True), {}, "sliding-window"),
        (qwen_config(hidden_act="gelu"), {}, "hidden_act"),
        (LlamaConfig(attention_bias=True), {}, "attention_bias"),
    ],
)
def test_unsupported_configs_fail_with_the_reason(config, kw, message):
    with pytest.raises(ValueError, match=message):
        shape_of(config, **kw)


def test_unknown_architecture_points_to_fsdp():
    from transformers import GPT2Config

    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported.*fsdp"):
        shape_of(GPT2Config())


def tiny_config(architecture, **kw):
    from rlcore.testing.tiny import build_tiny_tokenizer, tiny_config

    settings = dict(hidden_size=64, intermediate_size=32, num_layers=2, num_heads=8, num_kv_heads=2)
    settings.update(max_position_embeddings=256, tie_word_embeddings=False)
    return tiny_config(build_tiny_tokenizer(), architecture=architecture, **{**settings, **kw})


@pytest.mark.parametrize(
    ("architecture", "tied"),
    [("qwen3", True), ("qwen3", False), ("qwen3_moe", False), ("mixtral", False), ("mixtral", True)],
)
def test_maps_name_exactly_the_checkpoint_tensors_of_the_new_architectures(architecture, tied):
    """HF's checkpoint names (what ``save_pretrained`` writes and vLLM/SGLang load): per-expert tensors,
    not transformers 5's fused in-memory ``experts.gate_up_proj``."""
    from rlcore.testing.tiny import causal_lm_class
    from transformers.core_model_loading import revert_weight_conversion

    config = tiny_config(architecture, tie_word_embeddings=tied)
    model = causal_lm_class(architecture)(config)
    stored = set(revert_weight_conversion(model, model.state_dict()))
    exported = {n for pm in param_maps(shape_of(config)) if pm.export for n in (*pm.hf, *pm.aliases)}
    assert exported == stored | ({"lm_head.weight"} if tied else set())
    shape = shape_of(config)
    assert shape.qk_norm == architecture.startswith("qwen3")
    assert (shape.experts is not None) == (architecture != "qwen3")


def test_experts_round_trip_and_split_over_tensor_parallel_ranks():
    shape = shape_of(tiny_config("mixtral"), tp=2)
    pm = by_mcore(param_maps(shape), "decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight")
    assert pm.hf == tuple(f"model.layers.1.block_sparse_moe.experts.3.{w}.weight" for w in ("w1", "w3"))
    assert pm.expert == 3
    gate, up = torch.randn(32, 64), torch.randn(32, 64)
    full = to_mcore(pm, [gate, up], shape)
    assert torch.equal(shard(pm, full, 1, 2), torch.cat([gate[16:], up[16:]]))
    back = to_hf(pm, unshard(pm, [shard(pm, full, r, 2) for r in range(2)]), shape)
    assert torch.equal(back[0], gate) and torch.equal(back[1], up)


@pytest.mark.parametrize(
    ("architecture", "kw", "layout", "message"),
    [
        (
            "qwen3_moe",
            dict(mlp_only_layers=[0]),
            {},
            "dense layers .*every layer must be a mixture of experts",
        ),
        ("qwen3_moe", dict(decoder_sparse_step=2), {}, "decoder_sparse_step=2"),
        (
            "qwen3_moe",
            {},
            dict(ep_size=3),
            "expert_model_parallel_size=3 must divide the number of experts \\(4\\)",
        ),
        ("qwen3", {}, dict(ep_size=2), "needs a mixture-of-experts model; qwen3 is dense"),
        ("qwen3_moe", {}, dict(tp=64), "must divide num_key_value_heads"),
    ],
)
def test_unsupported_expert_layouts_fail_with_the_reason(architecture, kw, layout, message):
    config = tiny_config(architecture, **kw)
    with pytest.raises(ValueError, match=message):
        model_shape(
            config,
            tp_size=layout.get("tp", 1),
            pp_size=1,
            make_vocab_size_divisible_by=128,
            ep_size=layout.get("ep_size", 1),
        )


def test_router_settings_follow_the_hf_config():
    from rlcore_megatron.model import transformer_config

    shape = shape_of(tiny_config("qwen3_moe", norm_topk_prob=False, router_aux_loss_coef=0.02))
    cfg = transformer_config(shape, MegatronConfig(), torch.float32, recompute=False)
    assert (cfg.num_moe_experts, cfg.moe_router_topk, cfg.moe_ffn_hidden_size) == (4, 2, 32)
    assert cfg.moe_router_pre_softmax  # softmax over every expert first: no renormalisation of the top k
    assert (cfg.moe_aux_loss_coeff, cfg.moe_router_load_balancing_type) == (0.02, "aux_loss")
    cfg = transformer_config(shape, MegatronConfig(moe_aux_loss_coeff=0.0), torch.float32, recompute=False)
    assert cfg.moe_router_load_balancing_type == "none"
    assert cfg.qk_layernorm and not cfg.sequence_parallel


def test_llama3_rope_scaling_is_read_and_other_scalings_rejected():
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}  # fmt: skip
    config = LlamaConfig(rope_scaling=scaling, rope_theta=500000.0, max_position_embeddings=16384)
    shape = shape_of(config)
    assert (shape.rope_theta, shape.rope_scaling_factor) == (500000.0, 8.0)
    config = LlamaConfig(rope_scaling={**scaling, "high_freq_factor": 2.0}, max_position_embeddings=16384)
    with pytest.raises(ValueError, match="high_freq_factor"):
        shape_of(config)
    with pytest.raises(ValueError, match="rope_type 'yarn'"):
        shape_of(LlamaConfig(rope_scaling={"rope_type": "yarn", "factor": 2.0}))


def test_left_align_moves_real_tokens_to_the_front_and_restore_inverts_it():
    ids = torch.tensor([[0, 0, 5, 6, 7, 0], [1, 2, 3, 4, 0, 0], [0, 0, 0, 9, 0, 0]])
    mask = (ids != 0).long()
    mask[1, 0] = 1  # token id 1 is real, not padding
    aligned = left_align(ids, mask, multiple=4)
    assert aligned.tokens.tolist() == [[5, 6, 7, 0], [1, 2, 3, 4], [9, 0, 0, 0]]
    assert aligned.lead.tolist() == [2, 0, 3] and aligned.lengths.tolist() == [3, 4, 1]
    assert aligned.next_tokens().tolist() == [[6, 7, 0, 0], [2, 3, 4, 0], [0, 0, 0, 0]]
    values = torch.arange(12.0).view(3, 4)
    assert restore(values, aligned).tolist() == [
        [0, 0, 0, 1, 2, 0],
        [4, 5, 6, 7, 0, 0],
        [0, 0, 0, 8, 0, 0],
    ]


def test_left_align_rejects_gaps_inside_a_row():
    ids = torch.tensor([[3, 4, 5]])
    with pytest.raises(ValueError, match="row 0 has padding between real tokens"):
        left_align(ids, torch.tensor([[1, 0, 1]]))


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_micro_batch_inputs_reach_the_device_without_reading_it(packed):
    """The engine's per-micro-batch inputs are built on the host and then moved: on the ``meta`` device,
    which has no values, any read (a sync on a GPU) raises. The moved values equal those built on the
    host, and the packed boundaries keep their host copy."""
    ids = torch.tensor([[0, 0, 5, 6, 7, 0], [1, 2, 3, 4, 0, 0], [0, 0, 0, 9, 8, 0]])
    mask = (ids != 0).long()
    mask[1, 0] = 1
    batch = Batch({"input_ids": ids, "attention_mask": mask, "responses": ids[:, 4:]})
    on_meta = to_device(batch, torch.device("meta"), packed=packed, responses=True)
    on_host = to_device(batch, torch.device("cpu"), packed=packed, responses=True)
    moved = [on_meta[0]["input_ids"], on_meta[1].tokens, on_meta[1].lead, on_meta[1].lengths]
    moved += [on_meta[3].positions, on_meta[3].targets, on_meta[3].cells]
    assert all(t.is_meta for t in moved)
    assert on_host[1].lengths.tolist() == [3, 4, 2]
    assert on_host[3].targets.tolist() == [7, 8]
    if packed:
        meta, host = on_meta[2], on_host[2]
        assert meta.tokens.is_meta and meta.cu_seqlens.is_meta and meta.position_ids.is_meta
        assert meta.cu_seqlens_host.device.type == "cpu" and meta.max_seqlen == host.max_seqlen == 4
        assert meta.cu_seqlens_host.tolist() == host.cu_seqlens.tolist() == [0, 3, 7, 9]
        assert host.tokens.tolist() == [[5, 6, 7, 1, 2, 3, 4, 9, 8]]
        assert host.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3, 0, 1]]  # restart per sequence
        assert host.cu_seqlens.data_ptr() != host.cu_seqlens_host.data_ptr()
    else:
        assert on_meta[2] is None and on_host[2] is None


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("multiple", [1, 4])
def test_input_shape_from_the_lengths_is_the_shape_the_inputs_get(packed, multiple):
    """A step plans its pipeline hand-offs from the rows' lengths before it builds any micro-batch: the
    planned shape must be the built one, for ragged rows, a row with no tokens and a batch with none."""
    gen = torch.Generator().manual_seed(0)
    width = 9
    for lengths in ([3, 9, 5], [0, 4], [0, 0], [7], [1, 1, 1, 1]):
        ids = torch.randint(1, 50, (len(lengths), width), generator=gen)
        mask = torch.zeros_like(ids)
        for r, n in enumerate(lengths):
            start = int(torch.randint(0, width - n + 1, (), generator=gen))
            mask[r, start : start + n] = 1
        batch = Batch({"input_ids": ids * mask, "attention_mask": mask})
        _, aligned, packed_rows, _ = to_device(batch, torch.device("cpu"), multiple, packed)
        built = (packed_rows if packed else aligned).tokens.shape
        assert input_shape(lengths, multiple, packed) == tuple(built), lengths


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_response_tokens_pick_the_positions_that_predict_each_response_token(packed):
    """The head runs only where a response token is predicted. Against a plain loop over the padded
    layout: each counted response token ``(r, j)`` at column ``c`` is predicted by column ``c - 1``, whose
    position in the model output holds that column's token; the target is the token itself. A row with
    no prompt (its first response token has no predictor) and a row whose response is all padding
    count only what they have."""
    P, R = 3, 4
    ids = torch.tensor(
        [
            [0, 11, 12, 13, 14, 15, 0],  # prompt 2, response 3
            [21, 22, 23, 24, 25, 26, 27],  # full
            [0, 0, 0, 34, 35, 0, 0],  # no prompt: response token 0 has no predictor
            [0, 41, 42, 0, 0, 0, 0],  # empty response
        ]
    )
    mask = (ids != 0).long()
    aligned = left_align(ids, mask, multiple=2)
    packed_rows = pack(aligned) if packed else None
    got = response_tokens(ids, mask, R, aligned, packed_rows)
    # Each output position holds the token at that position, so a position is checked by its token.
    output = packed_rows.tokens if packed else aligned.tokens
    read = output.reshape(-1)[got.positions]
    expected_cells, expected_pred, expected_targets = [], [], []
    for r in range(ids.shape[0]):
        for j in range(R):
            c = P + j
            if mask[r, c] and c >= 1 and mask[r, c - 1]:
                expected_cells.append(r * R + j)
                expected_pred.append(int(ids[r, c - 1]))
                expected_targets.append(int(ids[r, c]))
    assert got.cells.tolist() == expected_cells == [0, 1, 2, 4, 5, 6, 7, 9]
    assert read.tolist() == expected_pred
    assert got.targets.tolist() == expected_targets
    placed = got.place(torch.arange(1.0, len(expected_cells) + 1))
    assert placed.shape == (4, R)
    assert placed.flatten().nonzero().flatten().tolist() == expected_cells


def test_response_tokens_without_prompt_columns():
    """All columns are response: token 0 has no predecessor, token 1 is predicted by position 0."""
    ids = torch.tensor([[5, 6, 0]])
    mask = (ids != 0).long()
    got = response_tokens(ids, mask, 3, left_align(ids, mask), None)
    assert (got.cells.tolist(), got.positions.tolist(), got.targets.tolist()) == ([1], [0], [6])


def test_response_tokens_keep_the_head_in_the_graph_when_nothing_counts():
    """With no response token to predict, one stand-in position keeps the head's weight in the backward
    (megatron-core's overlapped gradient reduction waits for every parameter) and adds nothing."""
    ids = torch.tensor([[5, 6, 0, 0]])
    mask = (ids != 0).long()
    aligned = left_align(ids, mask)
    got = response_tokens(ids, mask, 2, aligned, None)
    assert got.cells.numel() == 0 and got.positions.numel() == 1
    weight = torch.ones(3, requires_grad=True)
    values = (weight * 2.0).sum().expand(1)
    placed = got.place(values)
    assert placed.tolist() == [[0.0, 0.0]]
    placed.sum().backward()
    assert weight.grad is not None and weight.grad.tolist() == [0.0, 0.0, 0.0]


def test_response_columns_take_the_prediction_one_before_each_token():
    per_position = torch.arange(8.0).view(1, 8)  # P=5, R=3
    assert response_columns(per_position, 3).tolist() == [[4.0, 5.0, 6.0]]


def test_micro_batches_by_count_and_by_token_budget():
    mask = torch.tensor([[1] * 4 + [0] * 4, [1] * 8, [1] * 2 + [0] * 6, [1] * 3 + [0] * 5, [1] * 3 + [0] * 5])
    batch = Batch({"attention_mask": mask, "row": torch.arange(5)})
    assert [b["row"].tolist() for b in micro_batches(batch, 2)] == [[0, 1], [2, 3], [4]]
    # budget 9: [4] alone then 8 (2*8 > 9), then 2,3,3 -> 3 rows * 3 = 9 fits
    assert [b["row"].tolist() for b in micro_batches(batch, 2, max_tokens=9)] == [[0], [1], [2, 3, 4]]


def test_log_probs_and_entropy_match_float64_softmax_and_ignore_padded_vocab():
    torch.manual_seed(0)
    logits = torch.randn(3, 7, 40)
    targets = torch.randint(0, 37, (3, 7))
    logp, entropy = log_probs_and_entropy(logits, targets, vocab_start=0, vocab_size=37, temperature=0.7)
    ref = torch.log_softmax(logits[..., :37].double() / 0.7, -1)
    torch.testing.assert_close(
        logp.double(), ref.gather(-1, targets.unsqueeze(-1)).squeeze(-1), rtol=0, atol=1e-5
    )
    torch.testing.assert_close(entropy.double(), -(ref.exp() * ref).sum(-1), rtol=0, atol=1e-5)


def test_log_probs_gradient_matches_autograd_of_the_reference():
    torch.manual_seed(1)
    logits = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 16, (2, 5))
    logp, entropy = log_probs_and_entropy(logits, targets, vocab_start=0, vocab_size=16)
    (logp.sum() + 0.1 * entropy.sum()).backward()
    ours = logits.grad.clone()
    logits.grad = None
    ref = torch.log_softmax(logits, -1)
    (ref.gather(-1, targets.unsqueeze(-1)).sum() - 0.1 * (ref.exp() * ref).sum()).backward()
    torch.testing.assert_close(ours, logits.grad)


def test_vocabulary_slices_combine_to_the_whole_softmax_and_its_gradient():
    """The TP head's split, without processes: two ranks' slices of float64 logits (the second ending in
    padding rows) -> per-slice statistics -> combined, against ``log_softmax`` of the whole; each slice's
    gradient (from the combined ``lse`` and entropy, the target's one-hot only where the slice holds it)
    against autograd of the reference, at a temperature."""
    torch.manual_seed(2)
    temperature, real = 0.7, 37  # vocabulary 37 in two slices of 20 rows (the second ends in 3 padding)
    logits = torch.randn(6, 40, dtype=torch.float64)
    targets = torch.tensor([0, 5, 19, 20, 36, 27])  # both slices, their edges
    stats, grad_logits = slice_kernels(compiled=False)
    slices = [(0, 20), (20, real)]  # each rank's real rows
    per_slice = [slice_statistics(logits[:, a:b], targets - a, temperature, stats) for a, b in slices]
    log_probs, entropy, lse = combine_slices(torch.stack(per_slice))

    z = (logits[:, :real] / temperature).requires_grad_()
    ref = torch.log_softmax(z, -1)
    ref_lp, ref_ent = ref.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(ref.exp() * ref).sum(-1)
    torch.testing.assert_close(log_probs, ref_lp.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(entropy, ref_ent.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, torch.logsumexp(z.detach(), -1), rtol=0, atol=1e-12)

    g_lp, g_ent = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    (ref_lp * g_lp + ref_ent * g_ent).sum().backward()
    want = z.grad / temperature  # d/dlogits
    local = [torch.where((targets >= a) & (targets < b), targets - a, -1) for a, b in slices]
    got = torch.cat(
        [
            grad_logits(logits[:, a:b], t, lse, entropy, g_lp, g_ent, temperature)
            for (a, b), t in zip(slices, local, strict=True)
        ],
        -1,
    )
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert want.abs().max() > 0.1  # not vacuous


@pytest.mark.parametrize("keep", [False, True], ids=["recomputed", "kept"])
def test_chunked_head_on_one_rank_matches_float64_autograd(keep):
    """:func:`chunked_log_probs_and_entropy` (no group: the whole vocabulary is one slice, padded) in
    chunks of 4 tokens: values and the gradients of hidden state and weight against float64 autograd,
    with each chunk's logits recomputed in the backward or kept from the forward."""
    torch.manual_seed(3)
    hidden = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(24, 8, dtype=torch.float64, requires_grad=True)  # 21 real rows, 3 padding
    targets = torch.randint(0, 21, (2, 5))
    with FlopCounterMode(display=False) as flops:
        lp, ent = chunked_log_probs_and_entropy(
            hidden,
            weight,
            targets,
            chunk_tokens=4,
            vocab_start=0,
            vocab_size=21,
            temperature=1.3,
            keep_logits=keep,
        )
        (lp.sum() + 0.3 * ent.sum()).backward()
    # The logits' matmul (2 M V H) in the forward; the backward's two gradient matmuls, plus the
    # logits once more unless kept.
    projection = 2 * 10 * 21 * 8
    assert flops.get_total_flops() == projection * (3 if keep else 4)
    ours = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    ref = torch.log_softmax(torch.nn.functional.linear(hidden, weight[:21]) / 1.3, -1)
    ref_lp, ref_ent = ref.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(ref.exp() * ref).sum(-1)
    torch.testing.assert_close(lp, ref_lp.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(ent, ref_ent.detach(), rtol=0, atol=1e-12)
    (ref_lp.sum() + 0.3 * ref_ent.sum()).backward()
    torch.testing.assert_close(ours[0], hidden.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(ours[1], weight.grad, rtol=0, atol=1e-12)
    assert ours[1][21:].abs().max() == 0  # padding rows get no gradient


def test_config_validates_its_fields():
    with pytest.raises(ValueError, match="megatron.tensor_model_parallel_size must be an integer >= 1"):
        MegatronConfig(tensor_model_parallel_size=0)
    with pytest.raises(
        ValueError, match="megatron.transformer_impl must be one of local, transformer_engine"
    ):
        MegatronConfig(transformer_impl="apex")
    with pytest.raises(ValueError, match="megatron.expert_model_parallel_size must be an integer >= 1"):
        MegatronConfig(expert_model_parallel_size=0)


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        (["megatron.tensor_model_parallel_size=2"], "actor.world_size=1 is not a multiple of .* = 2 \\* 1"),
        (["megatron.tensor_model_parallel_size=2", "actor.world_size=2"], None),
        (
            [
                "megatron.tensor_model_parallel_size=2",
                "megatron.pipeline_model_parallel_size=2",
                "actor.world_size=8",
            ],
            None,
        ),
        (
            [
                "megatron.tensor_model_parallel_size=2",
                "megatron.pipeline_model_parallel_size=2",
                "actor.world_size=6",
            ],
            "actor.world_size=6 is not a multiple of .* = 2 \\* 2: set actor.world_size to a multiple of 4",
        ),
        (
            [
                "megatron.expert_model_parallel_size=4",
                "megatron.tensor_model_parallel_size=2",
                "actor.world_size=4",
            ],
            "expert_model_parallel_size = 2 \\* 1 \\* 4 .*: set actor.world_size to a multiple of 8",
        ),
    ],
)
def test_config_checks_the_parallel_sizes_against_the_actor_world_size(overrides, error):
    """Caught when the config is loaded, before any worker starts (it used to surface in the workers)."""
    from rlcore.config import ConfigError, load_config

    if error is None:
        config = load_config(overrides=overrides, engine="megatron", rollout="hf")
        assert config.actor.world_size % 2 == 0
    else:
        with pytest.raises(ConfigError, match=error):
            load_config(overrides=overrides, engine="megatron", rollout="hf")


def test_plugin_registers_the_engine_lazily():
    from rlcore.plugins import registry

    entry = registry("train_engines").entry("megatron")
    assert entry.options["config"] is MegatronConfig
    assert (
        entry.target == "rlcore_megatron.engine:MegatronEngine" or entry.target.__name__ == "MegatronEngine"
    )

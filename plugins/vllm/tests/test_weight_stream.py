"""The weight-stream filter in front of vLLM's reload (no vLLM needed: the model is read on meta)."""

import pytest
import torch
from rlcore.weights import bucketize
from rlcore_vllm.weight_stream import ModelWeights, StreamFilter, WeightStreamError

#: vLLM's Qwen2ForCausalLM.packed_modules_mapping (the engine asks its worker for it).
QWEN2_PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
ATTN = "model.layers.0.self_attn"


@pytest.fixture(scope="module")
def weights(tiny_model_path):
    return ModelWeights.from_pretrained(str(tiny_model_path), QWEN2_PACKED)


@pytest.fixture(scope="module")
def hf_params(tiny_model_path):
    """What a trainer exporting ``named_parameters()`` sends: no ``lm_head.weight`` (tied, deduplicated)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path), dtype=torch.float32)
    return [(n, p.detach().clone()) for n, p in model.named_parameters()]


def run(weights, buckets, dtype=torch.float32):
    stream = StreamFilter(weights, buckets, dtype)
    return stream, list(stream)


def test_model_weights_from_the_checkpoint(weights):
    assert (
        weights.layout.shapes["lm_head.weight"]
        == weights.layout.shapes["model.embed_tokens.weight"]
        == (1024, 256)
    )
    assert weights.layout.shapes[f"{ATTN}.k_proj.weight"] == (128, 256)
    assert set(weights.layout.ties["lm_head.weight"]) == {"lm_head.weight", "model.embed_tokens.weight"}
    assert weights.module_of(f"{ATTN}.k_proj.bias") == f"{ATTN}.qkv_proj"
    assert weights.module_of("model.layers.1.mlp.up_proj.weight") == "model.layers.1.mlp.gate_up_proj"
    assert weights.module_of("model.norm.weight") == "model.norm"
    assert weights.members()[f"{ATTN}.qkv_proj"] == {
        f"{ATTN}.{p}_proj.{k}" for p in "qkv" for k in ("weight", "bias")
    }


def test_full_stream_passes_whole_with_tied_lm_head(weights, hf_params):
    bound = max(t.numel() * t.element_size() for _, t in hf_params) // 3  # split the largest tensors
    stream, out = run(weights, bucketize(hf_params, bound), dtype=torch.bfloat16)
    stream.raise_if_failed()
    sent = dict(out)
    assert len(out) == len(sent) == len(hf_params) + 1, "each weight exactly once, plus the tied lm_head"
    for name, tensor in hf_params:
        assert sent[name].dtype == torch.bfloat16
        assert torch.equal(sent[name], tensor.to(torch.bfloat16)), name
    assert torch.equal(sent["lm_head.weight"], sent["model.embed_tokens.weight"])
    assert len(stream.loaded) == len(weights.members())


def test_fused_module_is_held_until_complete(weights, hf_params):
    params = dict(hf_params)
    order = [f"{ATTN}.q_proj.weight", f"{ATTN}.q_proj.bias", f"{ATTN}.o_proj.weight"] + [
        f"{ATTN}.{p}_proj.{k}" for p in "kv" for k in ("weight", "bias")
    ]
    stream, out = run(weights, [[(n, params[n])] for n in order])
    names = [n for n, _ in out]
    assert names[0] == f"{ATTN}.o_proj.weight", "o_proj is complete first; qkv waits for v_proj"
    assert sorted(names[1:]) == sorted(set(order) - {f"{ATTN}.o_proj.weight"})
    assert stream.loaded == [f"{ATTN}.o_proj", f"{ATTN}.qkv_proj"]
    stream.raise_if_failed()  # a partial stream of complete modules is fine


def test_incomplete_module_is_never_sent(weights, hf_params):
    params = dict(hf_params)
    sent_names = [f"{ATTN}.q_proj.weight", f"{ATTN}.k_proj.weight", "model.norm.weight"]
    stream, out = run(weights, [[(n, params[n]) for n in sent_names]])
    assert [n for n, _ in out] == ["model.norm.weight"]
    with pytest.raises(
        WeightStreamError, match=r"only partly sent.*qkv_proj \(missing .*q_proj\.bias"
    ) as info:
        stream.raise_if_failed()
    assert info.value.loaded == ("model.norm",)


def test_unknown_name_stops_the_stream(weights, hf_params):
    params = dict(hf_params)
    closed = []

    def buckets():  # a transport: it must be closed (drained) when the load stops early
        try:
            yield [("model.norm.weight", params["model.norm.weight"])]
            yield [("model.layers.0.self_attn.q_prj.weight", params[f"{ATTN}.q_proj.weight"])]
            yield [("model.layers.1.input_layernorm.weight", params["model.layers.1.input_layernorm.weight"])]
        finally:
            closed.append(True)

    stream, out = run(weights, buckets())
    assert [n for n, _ in out] == ["model.norm.weight"], "nothing after the bad name reaches vLLM"
    assert closed == [True]
    with pytest.raises(
        WeightStreamError, match=r"sent 'model\.layers\.0\.self_attn\.q_prj\.weight', which"
    ) as info:
        stream.raise_if_failed()
    assert f"'{ATTN}.q_proj.weight'" in str(info.value), "the closest valid name is suggested"
    assert "1 modules before it were loaded" in str(info.value)


def test_unknown_first_name_loads_nothing(weights):
    stream, out = run(weights, [[("module.model.norm.weight", torch.ones(256))]])
    assert out == []
    with pytest.raises(WeightStreamError, match=r"without wrapper prefixes.*nothing was loaded"):
        stream.raise_if_failed()


def test_wrong_shape(weights):
    stream, out = run(weights, [[("model.norm.weight", torch.ones(255))]])
    assert out == []
    with pytest.raises(
        WeightStreamError, match=r"shape \(255,\), but the rollout model .* has shape \(256,\)"
    ):
        stream.raise_if_failed()


def test_duplicate_name(weights):
    norm = torch.ones(256)
    stream, out = run(weights, [[("model.norm.weight", norm)], [("model.norm.weight", norm)]])
    assert [n for n, _ in out] == ["model.norm.weight"]
    with pytest.raises(WeightStreamError, match="sent 'model.norm.weight' twice"):
        stream.raise_if_failed()


def test_tied_names_must_agree(weights):
    embed = torch.randn(1024, 256)
    stream, out = run(weights, [[("model.embed_tokens.weight", embed), ("lm_head.weight", embed.clone())]])
    stream.raise_if_failed()
    assert sorted(n for n, _ in out) == ["lm_head.weight", "model.embed_tokens.weight"], "sent once each"
    stream, _ = run(weights, [[("model.embed_tokens.weight", embed), ("lm_head.weight", embed + 1)]])
    with pytest.raises(WeightStreamError, match="ties .* different values"):
        stream.raise_if_failed()


def test_failing_transport_is_reported_and_closed(weights):
    closed = []

    def buckets():
        try:
            yield [("model.norm.weight", torch.ones(256))]
            raise ConnectionError("peer went away")
        finally:
            closed.append(True)

    stream, out = run(weights, buckets())
    assert [n for n, _ in out] == ["model.norm.weight"]
    assert closed == [True]
    with pytest.raises(
        WeightStreamError, match=r"failed while being read \(ConnectionError: peer went away\)"
    ):
        stream.raise_if_failed()


# -- mixtures of experts -----------------------------------------------------------------------------
#: What the worker reports for the tiny MoE models: vLLM holds each layer's experts in one module.
def fused_experts(block: str) -> list[str]:
    return [f"model.layers.{i}.{block}.experts.routed_experts" for i in range(2)]


@pytest.fixture(scope="module")
def moe_weights(tiny_moe_path):
    # With gate_up_proj, as vLLM's Qwen3-MoE packs it when some layers are dense: an expert's gate_proj
    # must still go to the fused experts, not to a gate_up_proj of its own.
    return ModelWeights.from_pretrained(str(tiny_moe_path("qwen3_moe")), QWEN2_PACKED, fused_experts("mlp"))


@pytest.fixture(scope="module")
def moe_checkpoint(tiny_moe_path):
    from safetensors.torch import load_file

    return load_file(str(tiny_moe_path("qwen3_moe") / "model.safetensors"))


EXPERTS = "model.layers.0.mlp.experts"


def expert_names(layer: int = 0, block: str = "mlp", parts=("gate_proj", "up_proj", "down_proj")):
    return {f"model.layers.{layer}.{block}.experts.{e}.{p}.weight" for e in range(4) for p in parts}


def test_moe_layout_is_the_checkpoints_and_experts_are_one_module(moe_weights, moe_checkpoint):
    assert set(moe_weights.layout.shapes) == set(moe_checkpoint) | {"lm_head.weight"}
    assert moe_weights.layout.shapes[f"{EXPERTS}.3.down_proj.weight"] == (64, 64)
    assert moe_weights.module_of(f"{EXPERTS}.3.gate_proj.weight") == EXPERTS
    assert (
        moe_weights.module_of("model.layers.1.mlp.experts.0.down_proj.weight") == "model.layers.1.mlp.experts"
    )
    assert moe_weights.module_of("model.layers.0.mlp.gate.weight") == "model.layers.0.mlp.gate"  # the router
    assert moe_weights.members()[EXPERTS] == expert_names()


def test_mixtral_experts_are_one_module():
    from rlcore_vllm.direct_write import expert_containers, vllm_module_of

    containers = expert_containers(fused_experts("block_sparse_moe"))
    block = "model.layers.1.block_sparse_moe"
    assert vllm_module_of(f"{block}.experts.2.w3.weight", {}, containers) == f"{block}.experts"
    assert vllm_module_of(f"{block}.gate.weight", {}, containers) == f"{block}.gate"
    assert vllm_module_of("model.layers.1.self_attn.q_proj.weight", QWEN2_PACKED, containers) == (
        "model.layers.1.self_attn.qkv_proj"
    )


def test_experts_are_held_until_every_expert_arrived(moe_weights, moe_checkpoint):
    experts = sorted(expert_names())
    order = experts[:5] + ["model.norm.weight"] + experts[5:]
    stream, out = run(moe_weights, [[(n, moe_checkpoint[n])] for n in order])
    stream.raise_if_failed()
    names = [n for n, _ in out]
    assert names[0] == "model.norm.weight", "the norm is complete first; the experts wait for the last one"
    assert sorted(names[1:]) == experts
    assert stream.loaded == ["model.norm", EXPERTS]


def test_experts_missing_one_are_never_sent(moe_weights, moe_checkpoint):
    missing = f"{EXPERTS}.2.up_proj.weight"
    sent = sorted(expert_names() - {missing}) + ["model.norm.weight"]
    stream, out = run(moe_weights, [[(n, moe_checkpoint[n]) for n in sent]])
    assert [n for n, _ in out] == ["model.norm.weight"]
    with pytest.raises(WeightStreamError, match=rf"only partly sent.*{EXPERTS} \(missing {missing}\)"):
        stream.raise_if_failed()


def test_expert_of_wrong_shape_is_refused(moe_weights, moe_checkpoint):
    name = f"{EXPERTS}.1.down_proj.weight"
    stream, out = run(moe_weights, [[(name, moe_checkpoint[name].t()[:32])]])
    assert out == []
    with pytest.raises(WeightStreamError, match=r"experts\.1\.down_proj\.weight' with shape \(32, 64\)"):
        stream.raise_if_failed()


def test_fused_in_memory_experts_are_refused_with_the_fix(moe_weights):
    """transformers 5 holds the experts fused in memory; a trainer streaming ``state_dict()`` as it is
    sends names vLLM cannot load, and is told how to convert them."""
    stream, out = run(moe_weights, [[(f"{EXPERTS}.gate_up_proj", torch.zeros(4, 128, 64))]])
    assert out == []
    with pytest.raises(
        WeightStreamError, match=r"in-memory \(fused\) form of 8 checkpoint tensors.*CheckpointFormat"
    ):
        stream.raise_if_failed()

"""Direct weight writes (``rlcore_vllm.direct_write``) against vLLM's own weight loaders.

vLLM's Qwen2 model is built for real on CPU (its fused ``qkv_proj`` / ``gate_up_proj`` parameters, its
padded vocabulary, its tied output layer), in float64, in a child process (vLLM's distributed state is
process-global). The reference for where each Hugging Face weight lands is vLLM's ``load_weights`` (its
per-parameter weight loaders) and a float64 concatenation written out here; the plan's copies must match
both bit for bit.
"""

from __future__ import annotations

import multiprocessing
import socket
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import torch
from rlcore_vllm.direct_write import WritePlan, vllm_module_of

PACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check_against_vllm(model_dir: str, port: int) -> dict:
    """In a fresh process: build vLLM's model twice, load one with vLLM's loaders and write the other
    with a plan, and report every difference."""
    from rlcore.weights import WeightLayout
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
    from vllm.utils.torch_utils import set_default_torch_dtype

    config = VllmConfig(
        model_config=ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float32"),
        device_config=DeviceConfig("cpu"),
    )
    with set_current_vllm_config(config):
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, backend="gloo")
        initialize_model_parallel(1, 1)
        with set_default_torch_dtype(torch.float64):
            # Distinct prefixes: vLLM registers each attention layer by name (parameter names are unaffected).
            by_loaders = Qwen2ForCausalLM(vllm_config=config, prefix="loaders")
            by_plan = Qwen2ForCausalLM(vllm_config=config, prefix="plan")
    for model in (by_loaders, by_plan):
        for p in model.parameters():
            p.data.zero_()

    layout = WeightLayout.from_pretrained(model_dir)
    g = torch.Generator().manual_seed(0)
    stream = {
        name: torch.randn(shape, generator=g, dtype=torch.float64) for name, shape in layout.shapes.items()
    }
    for group in {tuple(names) for names in layout.ties.values()}:
        for name in group[1:]:
            stream[name] = stream[group[0]]  # tied names carry one tensor, as the trainer sends them
    by_loaders.load_weights(stream.items())

    ties = [list(t) for t in {tuple(names) for names in layout.ties.values()}]
    plan = WritePlan(dict(by_plan.named_parameters()), layout.shapes, ties, packed=PACKED)
    rest = plan.write(stream.items())
    params_loaders = dict(by_loaders.named_parameters())
    differing = [name for name, p in by_plan.named_parameters() if not torch.equal(p, params_loaders[name])]

    # The float64 layout written out by hand: fused = parts stacked in order; padded vocab rows stay 0.
    expected = {}
    for module in {vllm_module_of(name, PACKED) for name in layout.shapes}:
        head, _, last = module.rpartition(".")
        for leaf in ("weight", "bias"):
            parts = [f"{head}.{part}.{leaf}" for part in PACKED.get(last, (last,))]
            if all(p in stream for p in parts):
                expected[f"{module}.{leaf}"] = torch.cat([stream[p] for p in parts])
    params = dict(by_plan.named_parameters())
    wrong_by_hand = [
        name
        for name, want in expected.items()
        if name in params and not torch.equal(params[name][: want.shape[0]], want)
    ]
    embed = params["model.embed_tokens.weight"]
    padding_zero = bool((embed[layout.shapes["model.embed_tokens.weight"][0] :] == 0).all())

    # Planning without layer 0's attention: its q/k/v weights and biases go back whole, in order.
    partial = WritePlan(
        dict(by_plan.named_parameters()),
        layout.shapes,
        ties,
        packed=PACKED,
        writable={n for n, _ in by_plan.named_modules()} - {"model.layers.0.self_attn.qkv_proj"},
    )
    returned = [name for name, _ in partial.write(stream.items())]
    return {
        "rest": [name for name, _ in rest],
        "differing": differing,
        "wrong_by_hand": wrong_by_hand,
        "checked_by_hand": len([n for n in expected if n in params]),
        "vocab_padded": embed.shape[0] > layout.shapes["model.embed_tokens.weight"][0],
        "padding_zero": padding_zero,
        "skipped": sorted(plan.skipped),
        "partial_returned": returned,
        "planned": len(plan.views),
        "params": len(params),
    }


@pytest.fixture(scope="module")
def vllm_report(tmp_path_factory) -> dict:
    from transformers import Qwen2Config

    model_dir: Path = tmp_path_factory.mktemp("qwen2")
    # 200 tokens: vLLM pads the vocabulary to a multiple of 64, which the plan must leave alone.
    Qwen2Config(
        vocab_size=200,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    ).save_pretrained(model_dir)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=ctx) as pool:
        return pool.submit(_check_against_vllm, str(model_dir), _free_port()).result(timeout=300)


def test_plan_writes_every_weight_where_vllms_loaders_put_it(vllm_report):
    assert vllm_report["planned"] > 0
    assert vllm_report["rest"] == []  # an unquantized Qwen2 is written whole
    assert vllm_report["differing"] == []
    assert vllm_report["checked_by_hand"] == vllm_report["params"]
    assert vllm_report["wrong_by_hand"] == []


def test_tied_output_layer_is_written_once_and_padding_untouched(vllm_report):
    assert vllm_report["skipped"] == ["lm_head.weight"]  # vLLM shares it with the embedding
    assert vllm_report["vocab_padded"] and vllm_report["padding_zero"]


def test_modules_left_out_of_the_plan_go_to_the_reload_whole(vllm_report):
    assert sorted(vllm_report["partial_returned"]) == sorted(
        f"model.layers.0.self_attn.{p}_proj.{leaf}" for p in "qkv" for leaf in ("weight", "bias")
    )


def test_a_fused_module_missing_a_part_is_not_planned_at_all():
    """``k_proj`` absent from the checkpoint's names: ``qkv_proj`` cannot be assembled, so none of its
    parts is written directly (the reload would otherwise get q and v without k)."""
    params = {"layer.qkv_proj.weight": torch.zeros(6, 2), "layer.o_proj.weight": torch.zeros(2, 2)}
    shapes = {"layer.q_proj.weight": (2, 2), "layer.v_proj.weight": (2, 2), "layer.o_proj.weight": (2, 2)}
    plan = WritePlan(params, shapes, packed=PACKED)
    assert set(plan.views) == {"layer.o_proj.weight"}
    rest = plan.write([(n, torch.ones(s)) for n, s in shapes.items()])
    assert [n for n, _ in rest] == ["layer.q_proj.weight", "layer.v_proj.weight"]
    assert bool((params["layer.o_proj.weight"] == 1).all()) and bool(
        (params["layer.qkv_proj.weight"] == 0).all()
    )


def test_a_wrong_shape_is_an_error_naming_the_weight():
    params = {"layer.o_proj.weight": torch.zeros(2, 2)}
    plan = WritePlan(params, {"layer.o_proj.weight": (2, 2)})
    with pytest.raises(ValueError, match="layer.o_proj.weight"):
        plan.write([("layer.o_proj.weight", torch.ones(2, 3))])


def test_fused_experts_are_never_written_directly():
    """A mixture-of-experts layer: vLLM's fused ``w13``/``w2`` weights are assembled from the
    checkpoint's per-expert tensors by the reload, never by the plan; the router next to them is planned.
    Even a parameter inside the fused module that looks like a Hugging Face weight (name and shape) is
    left alone, which a plan without ``experts`` would write."""
    experts = "model.layers.0.mlp.experts"
    lookalike = f"{experts}.0.down_proj.weight"
    params = {
        f"{experts}.w13_weight": torch.zeros(2, 8, 4),
        f"{experts}.w2_weight": torch.zeros(2, 4, 4),
        lookalike: torch.zeros(4, 4),
        "model.layers.0.mlp.gate.weight": torch.zeros(2, 4),
    }
    shapes = {
        f"{experts}.{e}.{p}.weight": (4, 4) for e in range(2) for p in ("gate_proj", "up_proj", "down_proj")
    }
    shapes["model.layers.0.mlp.gate.weight"] = (2, 4)
    assert lookalike in WritePlan(params, shapes, packed=PACKED).views
    plan = WritePlan(params, shapes, packed=PACKED, experts=[experts])
    assert set(plan.views) == {"model.layers.0.mlp.gate.weight"}
    stream = [(n, torch.ones(s)) for n, s in shapes.items()]
    rest = plan.write(stream)
    assert [n for n, _ in rest] == [n for n, _ in stream if ".experts." in n]
    assert bool((params["model.layers.0.mlp.gate.weight"] == 1).all())
    assert all(bool((t == 0).all()) for n, t in params.items() if ".experts." in n)


def test_fused_moe_layers_are_not_direct_writable():
    """``direct_writable`` keeps only modules with unprocessed methods: vLLM's fused-MoE method is not one
    (its weights are shuffled or repacked after loading)."""
    from rlcore_vllm.direct_write import direct_writable

    class Layer(torch.nn.Module):
        def __init__(self, method: str):
            super().__init__()
            self.quant_method = type(method, (), {})()

    model = torch.nn.Module()
    model.gate = Layer("UnquantizedLinearMethod")
    model.experts = Layer("UnquantizedFusedMoEMethod")
    assert direct_writable(model) == {"", "gate"}

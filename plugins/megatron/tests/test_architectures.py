"""Qwen3 and the mixtures of experts Qwen3-MoE and Mixtral in the megatron engine, against float64
Hugging Face: log-probs, entropy and one AdamW step at TP=1, TP=2, PP=2 and expert parallelism EP=2,
and the HF -> Megatron -> HF round trip of the weights, bit for bit.

The engines run with the router's load-balancing loss off: HF's forward computes none (its
``router_aux_loss_coef`` applies only with ``output_router_logits``), so the step compares exactly.
"""

from __future__ import annotations

import mcore_arch_workers
import pytest
import torch
from mcore_testlib import ATOL, hf_model, hf_response_outputs, hf_train_step, make_batch, spawn
from safetensors.torch import load_file

pytestmark = pytest.mark.distributed

ARCHITECTURES = ("qwen3", "qwen3_moe", "mixtral")
LAYOUTS = {  # scenario -> architecture, for the two-rank run
    "tp2_qwen3": "qwen3",
    "tp2_qwen3_moe": "qwen3_moe",
    "pp2_qwen3_moe": "qwen3_moe",
    "ep2_qwen3_moe": "qwen3_moe",
    "ep2_mixtral": "mixtral",
    # EP=2, the ranks planning 3 against 1 micro-batches (ghosts) and 2 against 1 (a micro-batch cut).
    "ep2_ghosts": "qwen3_moe",
    "ep2_cut": "qwen3_moe",
}


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    from rlcore.testing.tiny import build_tiny_model

    return {
        arch: str(
            build_tiny_model(
                tmp_path_factory.mktemp(arch),
                architecture=arch,
                hidden_size=64,
                intermediate_size=64,
                num_layers=2,
                tie_word_embeddings=arch == "qwen3",
            )
        )
        for arch in ARCHITECTURES
    }


@pytest.fixture(scope="module")
def batch():
    return make_batch(1, 1024)


@pytest.fixture(scope="module")
def world1(paths, batch, tmp_path_factory):
    work = tmp_path_factory.mktemp("arch1")
    spawn(mcore_arch_workers.arch1, 1, paths, batch, str(work))
    return torch.load(work / "arch1_rank0.pt", weights_only=False)


@pytest.fixture(scope="module")
def world2(paths, batch, tmp_path_factory):
    work = tmp_path_factory.mktemp("arch2")
    spawn(mcore_arch_workers.arch2, 2, paths, batch, str(work))
    return [torch.load(work / f"arch2_rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.fixture(scope="module")
def reference(paths, batch):
    """Per architecture: the checkpoint's tensors (tied ones under both names, as the stream sends
    them), float64 log-probs and entropy, and one float64 AdamW step in checkpoint names."""
    from mcore_test_workers import ADAM_EPS
    from transformers.core_model_loading import revert_weight_conversion

    out = {}
    for arch, path in paths.items():
        model = hf_model(path, torch.float64)
        stored = load_file(f"{path}/model.safetensors")
        if model.config.tie_word_embeddings:
            stored["lm_head.weight"] = stored["model.embed_tokens.weight"]
        log_probs, entropy = hf_response_outputs(model, batch)
        loss, grad_norm, after = hf_train_step(
            model, batch, lr=1e-3, betas=(0.9, 0.999), eps=ADAM_EPS, weight_decay=0.01, grad_clip=1.0
        )
        model.load_state_dict(after)
        log_probs_after, _ = hf_response_outputs(model, batch)
        after = revert_weight_conversion(model, after)  # fused in-memory experts -> checkpoint names
        out[arch] = dict(
            stored=stored,
            log_probs=log_probs,
            entropy=entropy,
            loss=loss,
            grad_norm=grad_norm,
            after=after,
            log_probs_after=log_probs_after,
        )
    return out


def _holder(results, key):
    """The rank that holds outputs and weights (TP rank 0 of the last stage; under EP, DP rank 0)."""
    holders = [r for r in results if r[f"{key}_holds"] and r[f"{key}_dp"][0] == 0]
    assert len(holders) == 1
    return holders[0]


def _outputs(results, key):
    """``infer``'s outputs over the whole batch: data-parallel ranks (EP=2) each hold their rows."""
    parts = sorted((r[f"{key}_dp"][0], r[f"{key}_infer"]) for r in results if r[f"{key}_holds"])
    return {k: torch.cat([p[k] for _, p in parts]) for k in parts[0][1]}


def _check_outputs(outputs, ref, batch):
    mask = batch["response_mask"].bool()
    for name in ("log_probs", "entropy"):
        got = outputs[name].double()[mask]
        torch.testing.assert_close(got, ref[name][mask], rtol=0, atol=ATOL, msg=name)


def _check_weights(exported, expected, atol):
    assert set(exported) == set(expected), set(exported) ^ set(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(exported[name].double(), tensor.double(), rtol=0, atol=atol, msg=name)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_weights_round_trip_bit_exactly(world1, reference, arch):
    exported = world1[f"{arch}_export0"]
    assert set(exported) == set(reference[arch]["stored"])
    for name, tensor in reference[arch]["stored"].items():
        assert torch.equal(exported[name], tensor), name


@pytest.mark.parametrize("key", list(LAYOUTS))
def test_weights_round_trip_bit_exactly_when_split(world2, reference, key):
    exported = _holder(world2, key)[f"{key}_export0"]
    stored = reference[LAYOUTS[key]]["stored"]
    assert set(exported) == set(stored)
    for name, tensor in stored.items():
        assert torch.equal(exported[name], tensor), name


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_log_probs_and_entropy_equal_float64_hf(world1, reference, batch, arch):
    _check_outputs(world1[f"{arch}_infer"], reference[arch], batch)


@pytest.mark.parametrize("key", list(LAYOUTS))
def test_log_probs_and_entropy_equal_float64_hf_when_split(world2, reference, batch, key):
    _check_outputs(_outputs(world2, key), reference[LAYOUTS[key]], batch)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_one_training_step_equals_float64_hf(world1, reference, arch):
    ref, metrics = reference[arch], world1[f"{arch}_metrics"]
    assert metrics["loss"] == pytest.approx(ref["loss"], abs=ATOL)
    assert metrics["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4)
    _check_weights(world1[f"{arch}_export1"], ref["after"], atol=ATOL)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_log_probs_after_the_step_equal_float64_hf(world1, reference, batch, arch):
    """The forward after a step uses the stepped weights (MoE layers stack their experts once per
    forward/backward schedule and must not carry that copy over a step)."""
    mask = batch["response_mask"].bool()
    got = world1[f"{arch}_infer1"]["log_probs"].double()[mask]
    torch.testing.assert_close(got, reference[arch]["log_probs_after"][mask], rtol=0, atol=ATOL)


@pytest.mark.parametrize("key", list(LAYOUTS))
def test_one_training_step_equals_float64_hf_when_split(world2, reference, key):
    ref, metrics = reference[LAYOUTS[key]], _holder(world2, key)[f"{key}_metrics"]
    assert metrics["loss"] == pytest.approx(ref["loss"], abs=ATOL)
    assert metrics["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4)
    _check_weights(_holder(world2, key)[f"{key}_export1"], ref["after"], atol=ATOL)


def test_expert_parallel_ranks_hold_half_the_experts_each(world2):
    """EP=2 really splits: each rank trained on its own rows (two data-parallel ranks)."""
    assert sorted(r["ep2_qwen3_moe_dp"] for r in world2) == [(0, 2), (1, 2)]


def test_layouts_really_split_the_model(world2):
    """EP=2: each rank holds half of each layer's 4 experts (2 layers) and trains its own rows; MoE
    under TP=2 runs sequence-parallel (megatron-core trains MoE with TP only so), dense Qwen3 not."""
    assert [r["ep2_qwen3_moe_experts_here"] for r in world2] == [4, 4]
    assert [r["ep2_mixtral_experts_here"] for r in world2] == [4, 4]
    assert [r["tp2_qwen3_moe_experts_here"] for r in world2] == [8, 8]
    assert sorted(r["ep2_qwen3_moe_dp"] for r in world2) == [(0, 2), (1, 2)]
    assert all(r["tp2_qwen3_moe_sequence_parallel"] for r in world2)
    assert not any(r["tp2_qwen3_sequence_parallel"] for r in world2)


def test_experts_run_as_grouped_gemms_by_default_and_the_loop_when_asked(world1, world2):
    """Every MoE scenario but ``aux`` ran ``GroupedExperts`` (and matched float64 HF above); ``aux`` ran
    megatron-core's per-expert loop (and matched the float64 loop of the aux-loss test)."""
    for key in ("qwen3_moe", "mixtral"):
        assert world1[f"{key}_expert_modules"] == ["GroupedExperts"]
    for key in ("tp2_qwen3_moe", "pp2_qwen3_moe", "ep2_qwen3_moe", "ep2_mixtral"):
        assert all(r[f"{key}_expert_modules"] == ["GroupedExperts"] for r in world2)
    assert world1["aux_expert_modules"] == ["SequentialMLP"]
    assert world1["qwen3_expert_modules"] == []


def test_dense_mlp_splits_gate_up_by_default_and_is_megatron_cores_when_asked(
    world1, world2, reference, batch
):
    """``megatron.split_gate_up`` (default): the dense Qwen3 layers' MLPs are ``SplitGateUpMLP`` at TP=1 and
    TP=2 (and matched float64 HF above); MoE layers keep megatron-core's ``MoELayer``. With it off they
    are megatron-core's ``MLP``, which matches float64 HF too."""
    assert world1["qwen3_mlp_modules"] == ["SplitGateUpMLP"]
    assert all(r["tp2_qwen3_mlp_modules"] == ["SplitGateUpMLP"] for r in world2)
    for key in ("qwen3_moe", "mixtral"):
        assert world1[f"{key}_mlp_modules"] == ["MoELayer"]
    assert world1["qwen3_fused_mlp_modules"] == ["MLP"]
    _check_outputs(world1["qwen3_fused_infer"], reference["qwen3"], batch)
    ref, metrics = reference["qwen3"], world1["qwen3_fused_metrics"]
    assert metrics["loss"] == pytest.approx(ref["loss"], abs=ATOL)
    assert metrics["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4)
    _check_weights(world1["qwen3_fused_export1"], ref["after"], atol=ATOL)


def _expert_load(model, batch):
    """Float64 reference of the step's routing: per layer, tokens per expert over the real tokens."""
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        output_router_logits=True,
    )
    real = batch["attention_mask"].bool().flatten()
    k, experts = model.config.num_experts_per_tok, model.config.num_experts
    loads = []
    for logits in out.router_logits:  # [B * L, E] per layer
        top = logits[real].topk(k, dim=-1).indices
        loads.append(torch.nn.functional.one_hot(top, experts).sum((0, 1)).double())
    return loads


@pytest.mark.parametrize("key", ["qwen3_moe", "mixtral"])
def test_expert_load_metrics_count_the_routed_tokens(world1, world2, paths, batch, key):
    """``moe/load_max_over_mean/layer_<i>`` from the engine's router hooks equals max/mean of a float64
    count of each layer's top-k choices (padding included at the engine: counted over the aligned rows'
    real tokens here, so compared on the packed scenario and bounded on the padded ones)."""
    model = hf_model(paths["qwen3_moe"], torch.float64)
    loads = _expert_load(model, batch)
    metrics = world1["aux_metrics"]
    for i, load in enumerate(loads):
        assert metrics[f"moe/load_max_over_mean/layer_{i}"] == pytest.approx(float(load.max() / load.mean()))
    assert metrics["moe/load_max_over_mean"] == pytest.approx(
        sum(float(x.max() / x.mean()) for x in loads) / len(loads)
    )
    for metrics in (world1[f"{key}_metrics"], _holder(world2, f"ep2_{key}")[f"ep2_{key}_metrics"]):
        ratios = [metrics[f"moe/load_max_over_mean/layer_{i}"] for i in range(2)]
        assert all(1.0 <= x <= 4.0 for x in ratios)  # E=4 experts: 1 even, 4 all on one


def test_the_load_balancing_loss_trains_the_router_as_a_float64_reference(world1, reference, paths, batch):
    """Megatron's aux loss (coefficient 0.1, ``megatron.moe_aux_loss_coeff``) against a plain float64
    loop: per layer ``coeff * E * sum_e f_e * P_e`` with ``f_e`` the share of top-k choices and ``P_e``
    the mean router probability over the step's tokens, added to the token-mean NLL."""
    from mcore_arch_workers import AUX_COEFF
    from mcore_test_workers import ADAM_EPS
    from transformers.core_model_loading import revert_weight_conversion

    model = hf_model(paths["qwen3_moe"], torch.float64)
    real = batch["attention_mask"].bool().flatten()
    k, experts = model.config.num_experts_per_tok, model.config.num_experts

    def aux_loss(outputs):
        aux = 0.0
        for logits in outputs.router_logits:  # [B * L, E] per layer
            probs = torch.softmax(logits[real], -1)
            share = torch.nn.functional.one_hot(probs.topk(k, -1).indices, experts).sum((0, 1)) / (
                len(probs) * k
            )
            aux = aux + AUX_COEFF * experts * (share * probs.mean(0)).sum()
        return aux

    _, _, after = hf_train_step(
        model,
        batch,
        lr=1e-3,
        betas=(0.9, 0.999),
        eps=ADAM_EPS,
        weight_decay=0.01,
        grad_clip=1.0,
        extra_loss=aux_loss,
    )
    after = revert_weight_conversion(model, after)
    exported = world1["aux_export1"]
    _check_weights(exported, after, atol=ATOL)
    # The loss is large enough to matter: without it the routers end elsewhere.
    without = reference["qwen3_moe"]["after"]
    router = "model.layers.0.mlp.gate.weight"
    assert (exported[router].double() - without[router].double()).abs().max() > 3 * ATOL

"""The one-process engine against plain Hugging Face references computed row by row in float64."""

import pytest
import torch
from fsdp_support import batch, full_weights, hf_reference, nll_entropy_loss, spec, train_reference
from rlcore.api import DistInfo
from rlcore.devices import get_platform
from rlcore.testing.numerics import reduction_atol
from rlcore_fsdp import attention
from rlcore_fsdp.config import FSDPConfig
from rlcore_fsdp.engine import FSDPEngine
from transformers import AutoConfig, AutoModelForCausalLM

TEMPERATURE = 0.7


def make(model_path, config=None, **overrides) -> FSDPEngine:
    return FSDPEngine(
        spec(str(model_path), **overrides), config or FSDPConfig(), get_platform("cpu"), DistInfo()
    )


@pytest.fixture(scope="module")
def hf64(tiny_model_path):
    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float64)


@pytest.mark.parametrize("dtype, atol", [("float64", 1e-10), ("float32", 2e-5)])
def test_infer_equals_hf_log_softmax(tiny_model_path, hf64, dtype, atol):
    engine = make(tiny_model_path, dtype=dtype, temperature=TEMPERATURE, micro_batch_size=3)
    data = batch()
    out = engine.infer(data, ["log_probs", "entropy"])
    want_lp, want_ent = hf_reference(hf64, data, TEMPERATURE)
    assert out["log_probs"].shape == want_lp.shape == (7, 5)
    torch.testing.assert_close(out["log_probs"].double(), want_lp, rtol=0, atol=atol)
    torch.testing.assert_close(out["entropy"].double(), want_ent, rtol=0, atol=atol)


def test_chunked_packed_and_padded_infer_agree(tiny_model_path):
    data = batch()
    whole = make(tiny_model_path, FSDPConfig(logits_chunk_size=4096)).infer(data, ["log_probs", "entropy"])
    chunked = make(tiny_model_path, FSDPConfig(logits_chunk_size=3)).infer(data, ["log_probs", "entropy"])
    packed = make(
        tiny_model_path,
        FSDPConfig(use_remove_padding=True, logits_chunk_size=5),
        max_tokens_per_micro_batch=20,
    )
    packed_out = packed.infer(data, ["log_probs", "entropy"])
    varlen = make(
        tiny_model_path,
        FSDPConfig(use_remove_padding=True, attn_implementation="varlen", logits_chunk_size=5),
        max_tokens_per_micro_batch=20,
    )
    varlen_out = varlen.infer(data, ["log_probs", "entropy"])
    # Each variant sums the same terms in another order (chunks of the vocabulary, packed rows, another
    # attention kernel); they agree to fp32 rounding over the model's reduction path.
    n = path_reduction_length(tiny_model_path, seq_len=data["input_ids"].shape[1])
    for key in ("log_probs", "entropy"):
        atol = reduction_atol(torch.float32, n, scale=whole[key].abs().max().item())
        torch.testing.assert_close(chunked[key], whole[key], rtol=0, atol=atol)
        torch.testing.assert_close(packed_out[key], whole[key], rtol=0, atol=atol)
        torch.testing.assert_close(varlen_out[key], whole[key], rtol=0, atol=atol)


def path_reduction_length(model_path, seq_len: int) -> int:
    """Terms summed along the way from an embedding to a log-prob: per layer the attention projections,
    the attention over ``seq_len`` positions, the MLP; then the output layer and the softmax."""
    config = AutoConfig.from_pretrained(model_path)
    hidden, inner = config.hidden_size, config.intermediate_size
    per_layer = 4 * hidden + seq_len + 2 * hidden + inner
    return config.num_hidden_layers * per_layer + hidden + config.vocab_size


# Warm-up over 2 steps, then cosine to 10% at step 4: factors worked out by hand.
SCHEDULE = dict(warmup_steps=2, total_steps=4, lr_schedule="cosine", min_lr_ratio=0.1)
LR_FACTORS = [0.5, 1.0, 1.0, 0.55]


@pytest.fixture(scope="module")
def trained_reference(tiny_model_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float64)
    return train_reference(model, batch(), spec("", dtype="float64", temperature=TEMPERATURE), LR_FACTORS)


@pytest.mark.parametrize(
    "config, overrides",
    [
        ({}, {"micro_batch_size": 3}),
        ({"use_remove_padding": True, "logits_chunk_size": 4}, {"max_tokens_per_micro_batch": 24}),
        (
            {"use_remove_padding": True, "attn_implementation": "varlen", "logits_chunk_size": 4},
            {"max_tokens_per_micro_batch": 24},
        ),
        (
            {"use_remove_padding": True, "logits_chunk_size": 4, "recompute_logits": False},
            {"max_tokens_per_micro_batch": 30},
        ),
        ({"reshard_after_forward": False}, {"micro_batch_size": 7, "gradient_checkpointing": True}),
    ],
    ids=["padded", "packed-token-budget", "packed-varlen", "kept-logits", "checkpointing"],
)
def test_train_steps_equal_plain_hf_loop(tiny_model_path, trained_reference, config, overrides):
    want_weights, want_metrics = trained_reference
    engine = make(
        tiny_model_path,
        FSDPConfig(**config),
        dtype="float64",
        temperature=TEMPERATURE,
        **SCHEDULE,
        **overrides,
    )
    for want in want_metrics:
        got = engine.train_step(batch(), nll_entropy_loss)
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-10)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-9)
        assert got["lr"] == pytest.approx(want["lr"], rel=1e-12)
    assert want_metrics[0]["grad_norm"] > spec("").grad_clip, "the test must exercise clipping"
    weights = full_weights(engine)
    assert sorted(weights) == sorted(want_weights)
    for name, tensor in want_weights.items():
        torch.testing.assert_close(weights[name], tensor, rtol=0, atol=1e-9, msg=name)


def test_bf16_mixed_precision_trains_and_keeps_fp32_weights(tiny_model_path):
    data = batch()
    fp32 = make(tiny_model_path).infer(data, ["log_probs"])["log_probs"]
    engine = make(tiny_model_path, FSDPConfig(mixed_precision="bfloat16"), lr=1e-2)
    bf16 = engine.infer(data, ["log_probs"])["log_probs"]
    assert bf16.dtype == torch.float32
    mask = data["response_mask"].bool()
    assert 0 < float((bf16 - fp32)[mask].abs().max()) < 0.1, (
        "bf16 compute should be close to, not equal to, fp32"
    )
    losses = [engine.train_step(data, nll_entropy_loss)["loss"] for _ in range(2)]
    assert losses[-1] < losses[0]
    assert all(p.dtype == torch.float32 for p in engine.module.parameters())


def test_varlen_attention_needs_packing(tiny_model_path):
    with pytest.raises(ValueError, match="use_remove_padding=true"):
        make(tiny_model_path, FSDPConfig(attn_implementation="varlen"))


def test_compiled_varlen_train_steps_equal_eager(tiny_model_path):
    """``fsdp.compile`` with the ``varlen`` backend on the CPU: the compiled layers take the per-sequence
    path, as eager ones do (they once traced the flash kernel, which then failed at run time). The compiled
    engine goes first, with the kernel probe forgotten, so its decision is made while dynamo traces, as in
    a compiled run's own process. Inductor fuses the float32 arithmetic inside Qwen2's RMSNorm (which
    upcasts to float32 even in a float64 model) differently from eager, so even in float64 the two agree
    to float32 precision, not to the last bit."""
    attention._probe.cache_clear()
    metrics = {}
    for compile_ in (True, False):
        engine = make(
            tiny_model_path,
            FSDPConfig(
                use_remove_padding=True, attn_implementation="varlen", logits_chunk_size=4, compile=compile_
            ),
            dtype="float64",
            temperature=TEMPERATURE,
            max_tokens_per_micro_batch=24,
        )
        metrics[compile_] = [engine.train_step(batch(), nll_entropy_loss) for _ in range(2)]
    for eager, compiled in zip(metrics[False], metrics[True], strict=True):
        assert compiled["loss"] == pytest.approx(eager["loss"], rel=1e-6)
        assert compiled["grad_norm"] == pytest.approx(eager["grad_norm"], rel=1e-6)

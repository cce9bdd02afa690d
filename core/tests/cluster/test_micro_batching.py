"""The default micro-batch budget (rlcore.cluster.micro_batching) and how the config reaches it."""

import attrs
import pytest
import torch
from rlcore.api import EngineSpec
from rlcore.cluster import micro_batching
from rlcore.cluster.micro_batching import AUTO, MAX_TOKENS, ModelShape, resolve, token_budget
from rlcore.config import load_config
from rlcore.config.specs import engine_spec
from rlcore.testing.tiny import build_tiny_model
from transformers import AutoConfig, AutoModelForCausalLM

QWEN_05B = ModelShape(hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2, vocab=151936, tied=True)
GIB = 2**30


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def test_parameter_count_matches_the_model(tiny):
    model = AutoModelForCausalLM.from_pretrained(tiny)
    counted = sum(p.numel() for p in model.parameters())
    estimate = ModelShape.from_hf_config(AutoConfig.from_pretrained(tiny)).parameters()
    # norms (and biases where a model has them) are left out of the estimate
    assert estimate <= counted < estimate * 1.01


def test_activation_estimate_covers_what_autograd_keeps(tiny):
    """The estimate per token is at least what the model's forward actually keeps for its backward,
    measured by the saved-tensor hooks over a batch (the estimate adds OVERHEAD on top)."""
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    ids = torch.randint(3, 1000, (4, 64))
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        hidden = model.model(input_ids=ids).last_hidden_state
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept = sum(n for ptr, n in saved.items() if ptr not in params)
    shape = ModelShape.from_hf_config(model.config)
    per_token = shape.activation_bytes_per_token(4, gradient_checkpointing=False)
    assert hidden.shape[-1] == shape.hidden
    assert kept / ids.numel() <= per_token


def test_budget_grows_with_memory_and_is_clamped():
    common = dict(dtype="bfloat16", gradient_checkpointing=False, trainable=True, shards=1, longest=1024)
    small = token_budget(QWEN_05B, device_bytes=24 * GIB, **common)
    large = token_budget(QWEN_05B, device_bytes=80 * GIB, **common)
    assert 1024 <= small < large <= MAX_TOKENS
    # a device too small for one sequence still gets one (the engine then reports the OOM itself)
    assert token_budget(QWEN_05B, device_bytes=1 * GIB, **common) == 1024
    assert token_budget(QWEN_05B, device_bytes=10_000 * GIB, **common) == MAX_TOKENS


def test_budget_by_hand_for_a_qwen_05b_shape():
    """The formula of the module doc, computed here independently for one case."""
    per_param = 2 + 2 + 8  # bf16 weight, bf16 gradient, two fp32 moments
    params = 24 * (896 * (896 + 2 * 2 * 64) + 896 * 896 + 3 * 896 * 4864) + 151936 * 896
    per_layer = (5 * 896 + 2 * 2 * 64 + 3 * 4864) * 2
    per_token = 2.0 * (24 * per_layer + 896 * 2 + 16)
    expected = int(0.25 * (80 * GIB - params * per_param) / int(per_token))
    got = token_budget(
        QWEN_05B,
        device_bytes=80 * GIB,
        dtype="bfloat16",
        gradient_checkpointing=False,
        trainable=True,
        shards=1,
        longest=512,
    )
    assert got == expected


def test_mixed_precision_and_inference_budgets_by_hand():
    """fp32 parameters computing in bf16 count bf16 activations (the states stay fp32); a reference
    model, never trained, keeps one layer's activations at a time and no gradients or moments."""
    params = 24 * (896 * (896 + 2 * 2 * 64) + 896 * 896 + 3 * 896 * 4864) + 151936 * 896
    per_layer_bf16 = (5 * 896 + 2 * 2 * 64 + 3 * 4864) * 2
    common = dict(device_bytes=80 * GIB, dtype="float32", gradient_checkpointing=False, shards=1, longest=512)
    mixed = token_budget(QWEN_05B, trainable=True, activation_dtype="bfloat16", **common)
    per_token = int(2.0 * (24 * per_layer_bf16 + 896 * 2 + 16))
    assert mixed == min(MAX_TOKENS, int(0.25 * (80 * GIB - params * (4 + 4 + 8)) / per_token))
    assert mixed > token_budget(QWEN_05B, trainable=True, **common)  # fp32 activations: half as many
    small = dict(common, device_bytes=8 * GIB)
    inference = token_budget(QWEN_05B, trainable=False, activation_dtype="bfloat16", **small)
    per_token = int(2.0 * (per_layer_bf16 + 896 * 2 + 16))
    assert inference == min(MAX_TOKENS, int(0.25 * (8 * GIB - params * 4) / per_token))


def test_checkpointing_sharding_and_inference_allow_more_tokens():
    common = dict(device_bytes=40 * GIB, dtype="bfloat16", longest=256)
    base = token_budget(QWEN_05B, gradient_checkpointing=False, trainable=True, shards=1, **common)
    assert token_budget(QWEN_05B, gradient_checkpointing=True, trainable=True, shards=1, **common) > base
    assert token_budget(QWEN_05B, gradient_checkpointing=False, trainable=True, shards=8, **common) > base
    assert token_budget(QWEN_05B, gradient_checkpointing=False, trainable=False, shards=1, **common) > base


def test_resolve_replaces_auto_only(tiny):
    spec = EngineSpec(model_path=str(tiny), max_tokens_per_micro_batch=AUTO, max_sequence_length=100)
    resolved = resolve(spec, device_bytes=2 * GIB, shards=1)
    assert isinstance(resolved.max_tokens_per_micro_batch, int)
    assert resolved.max_tokens_per_micro_batch >= 100
    assert resolved.micro_batch_size == resolved.max_tokens_per_micro_batch // 100
    assert attrs.evolve(resolved, max_tokens_per_micro_batch=AUTO, micro_batch_size=4) == spec
    fixed = EngineSpec(model_path=str(tiny), max_tokens_per_micro_batch=None, micro_batch_size=3)
    assert resolve(fixed, device_bytes=2 * GIB, shards=1) is fixed


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ([], (AUTO, micro_batching.AUTO)),
        (["actor.micro_batch_size=4"], (None, 4)),
        (["actor.max_tokens_per_micro_batch=2048"], (2048, None)),
        (["actor.micro_batch_size=4", "actor.max_tokens_per_micro_batch=2048"], (2048, 4)),
    ],
    ids=["default", "rows", "tokens", "both"],
)
def test_config_to_engine_spec(overrides, expected):
    config = load_config(overrides=overrides)
    for role in ("actor", "reference"):
        spec = engine_spec(config, role)
        assert spec.max_tokens_per_micro_batch == expected[0]
        if expected[1] != AUTO and expected[1] is not None:
            assert spec.micro_batch_size == expected[1]
        assert spec.max_sequence_length == config.data.max_prompt_length + config.rollout.max_response_length
    critic = engine_spec(load_config(overrides=["critic.micro_batch_size=5"]), "critic")
    assert (critic.max_tokens_per_micro_batch, critic.micro_batch_size) == (None, 5)
    assert engine_spec(load_config(), "critic").max_tokens_per_micro_batch == AUTO


def test_the_worker_builds_its_engine_with_a_budget(tiny, capfd):
    from rlcore.cluster.workers import TrainWorker

    spec = EngineSpec(model_path=str(tiny), max_tokens_per_micro_batch=AUTO, max_sequence_length=64)
    worker = TrainWorker("actor", "fsdp", spec, device="cpu")
    try:
        budget = worker.engine.spec.max_tokens_per_micro_batch
        assert isinstance(budget, int) and budget >= 64
        assert worker.engine.spec.micro_batch_size == budget // 64
        assert f"micro-batches of up to {budget} tokens" in capfd.readouterr().err
    finally:
        worker.shutdown()

"""The request checks and seeds every rollout engine shares (rlcore.api.requests)."""

import pytest
from rlcore.api import SamplingParams, check_prompts, check_sampling, check_tags, request_seeds, rollout_dtype


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"temperature": -0.5}, "sampling.temperature must be >= 0"),
        ({"top_p": 0.0}, r"sampling.top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"sampling.top_p must be in \(0, 1\]"),
        ({"top_k": -2}, "sampling.top_k must be -1 or 0"),
        ({"stop": ("ok", "")}, "sampling.stop must hold non-empty strings"),
    ],
)
def test_check_sampling_names_the_key(values, message):
    with pytest.raises(ValueError, match=message):
        check_sampling(SamplingParams(**values))


def test_check_prompts():
    params = SamplingParams(max_tokens=10)
    assert check_prompts([(1, 2), [3]], params, vocab_size=8, max_model_len=16, engine="vllm") == [
        [1, 2],
        [3],
    ]
    with pytest.raises(ValueError, match="vllm rollout: prompt 1 is empty"):
        check_prompts([[1], []], params, vocab_size=8, max_model_len=16, engine="vllm")
    with pytest.raises(ValueError, match=r"prompt 0 has token id 8 outside the model's vocabulary \[0, 8\)"):
        check_prompts([[1, 8]], params, vocab_size=8, max_model_len=16, engine="vllm")
    with pytest.raises(TypeError, match="wrap a single prompt"):
        check_prompts([1, 2, 3], params, vocab_size=8, max_model_len=16, engine="vllm")


def test_max_tokens_must_fit_the_model_length():
    # 6 prompt tokens + 10 new = 16 fits exactly; 7 + 10 does not, and the message says how many fit.
    check_prompts([[1] * 6], SamplingParams(max_tokens=10), vocab_size=8, max_model_len=16, engine="vllm")
    with pytest.raises(ValueError, match=r"prompt 0 has 7 tokens.*max_tokens=10.*at most 9 new tokens fit"):
        check_prompts([[1] * 7], SamplingParams(max_tokens=10), vocab_size=8, max_model_len=16, engine="vllm")


def test_request_seeds_are_distinct_per_sample():
    params = SamplingParams(n=3, seed=100)
    seeds = [s for i in range(4) for s in request_seeds(params, i)]
    assert seeds == list(range(100, 112))
    assert request_seeds(SamplingParams(n=2), 5) == [None, None]


def test_tags_in_order_without_repeats_and_bad_ones_named():
    assert check_tags(["kv_cache", "weights", "kv_cache"], engine="hf") == ["weights", "kv_cache"]
    with pytest.raises(
        ValueError, match=r"vllm rollout: unknown memory tags \['kv'\]; valid tags: weights, kv_cache"
    ):
        check_tags(["weights", "kv"], engine="vllm")
    with pytest.raises(TypeError, match="got the string 'weights'"):
        check_tags("weights", engine="sglang")


def test_rollout_dtype():
    import torch

    assert rollout_dtype("bfloat16") is torch.bfloat16 and rollout_dtype("float32") is torch.float32
    with pytest.raises(
        ValueError, match="rollout.dtype must be one of float32, bfloat16, float16, got 'fp8'"
    ):
        rollout_dtype("fp8")

"""Sampling settings and prompt checks (no vLLM needed)."""

import pytest
from rlcore.api import SamplingParams
from rlcore_vllm.sampling import check_prompts, check_sampling, request_seeds, sampling_params_from_dict


def test_from_dict_builds_params():
    params = sampling_params_from_dict({"n": 4, "temperature": 0.7, "top_k": 20, "stop": ["\n\n", "END"]})
    assert params == SamplingParams(n=4, temperature=0.7, top_k=20, stop=("\n\n", "END"))
    assert sampling_params_from_dict({"stop": "END"}).stop == ("END",)


def test_from_dict_unknown_key_lists_valid_keys():
    with pytest.raises(
        ValueError, match=r"rollout\.sampling: unknown key\(s\) 'max_new_tokens', 'temp'"
    ) as info:
        sampling_params_from_dict({"temp": 1.0, "max_new_tokens": 3}, where="rollout.sampling")
    for key in ("n", "temperature", "top_p", "top_k", "max_tokens", "stop", "logprobs", "seed"):
        assert key in str(info.value)


@pytest.mark.parametrize("key", ["n", "max_tokens"])
def test_from_dict_counts_below_one(key):
    with pytest.raises(ValueError, match=f"sampling.{key} must be >= 1, got 0"):
        sampling_params_from_dict({key: 0})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"temperature": -0.5}, "sampling.temperature must be >= 0"),
        ({"top_p": 0.0}, r"sampling.top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"sampling.top_p must be in \(0, 1\]"),
        ({"top_k": -2}, "sampling.top_k must be -1 or 0"),
        ({"stop": ["ok", ""]}, "sampling.stop must hold non-empty strings"),
    ],
)
def test_check_sampling_names_the_key(values, message):
    with pytest.raises(ValueError, match=message):
        check_sampling(sampling_params_from_dict(values))


def test_check_prompts():
    params = SamplingParams(max_tokens=10)
    assert check_prompts([(1, 2), [3]], params, vocab_size=8, max_model_len=16) == [[1, 2], [3]]
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        check_prompts([[1], []], params, vocab_size=8, max_model_len=16)
    with pytest.raises(ValueError, match=r"prompt 0 has token id 8 outside the model's vocabulary \[0, 8\)"):
        check_prompts([[1, 8]], params, vocab_size=8, max_model_len=16)
    with pytest.raises(TypeError, match="wrap a single prompt"):
        check_prompts([1, 2, 3], params, vocab_size=8, max_model_len=16)


def test_max_tokens_must_fit_the_model_length():
    # 6 prompt tokens + 10 new = 16 fits exactly; 7 + 10 does not, and the message says how many fit.
    check_prompts([[1] * 6], SamplingParams(max_tokens=10), vocab_size=8, max_model_len=16)
    with pytest.raises(ValueError, match=r"prompt 0 has 7 tokens.*max_tokens=10.*at most 9 new tokens fit"):
        check_prompts([[1] * 7], SamplingParams(max_tokens=10), vocab_size=8, max_model_len=16)


def test_request_seeds_are_distinct_per_sample():
    params = SamplingParams(n=3, seed=100)
    seeds = [s for i in range(4) for s in request_seeds(params, i)]
    assert seeds == list(range(100, 112))
    assert request_seeds(SamplingParams(n=2), 5) == [None, None]

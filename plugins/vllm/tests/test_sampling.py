"""Sampling settings from a mapping (no vLLM needed); the request checks are core's (rlcore.api.requests)."""

import pytest
from rlcore.api import SamplingParams
from rlcore_vllm.sampling import sampling_params_from_dict


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


def test_sampled_log_probs_reads_flat_and_per_position_forms():
    """The plugin asks for flat log-probs (``flat_logprobs``); both of vLLM's forms give the sampled
    tokens' values, and flat ones that do not follow the sampled tokens are refused."""
    from rlcore_vllm.sampling import sampled_log_probs
    from vllm.logprobs import FlatLogprobs, Logprob

    positions = [{5: Logprob(logprob=-0.5, rank=1)}, {7: Logprob(logprob=-1.25, rank=3)}]
    flat = FlatLogprobs()
    flat.extend(positions)
    assert sampled_log_probs(flat, [5, 7]) == [-0.5, -1.25]
    assert sampled_log_probs(positions, [5, 7]) == [-0.5, -1.25]
    assert sampled_log_probs(None, [5, 7]) is None
    with pytest.raises(RuntimeError, match="do not follow the sampled tokens"):
        sampled_log_probs(flat, [5, 8])
    with pytest.raises(RuntimeError, match="do not follow the sampled tokens"):
        sampled_log_probs(flat, [5])

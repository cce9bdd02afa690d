"""Sampling settings into SGLang's parameter dicts, and SGLang results into Completions (no sglang:
SGLang takes and returns plain dicts; the results below have the shape its ``async_generate`` returns)."""

import pytest
from rlcore.api import SamplingParams, request_seeds
from rlcore_sglang.sampling import to_completion, to_sglang


def result(ids, logprobs, reason, text="", rid="rlcore-x-0"):
    meta = {"id": rid, "finish_reason": reason}
    if logprobs is not None:
        meta["output_token_logprobs"] = [(lp, t, None) for lp, t in zip(logprobs, ids, strict=True)]
    return {"text": text, "output_ids": ids, "meta_info": meta}


def test_every_distribution_setting_is_explicit():
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=0, max_tokens=32, stop=("\n\n",))
    got = to_sglang(params, seed=12)
    assert got == {
        "max_new_tokens": 32,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": -1,  # rlcore's 0 or -1 (off) is SGLang's -1 (whole vocabulary); SGLang rejects 0
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "skip_special_tokens": True,
        "no_stop_trim": False,
        "stop": ["\n\n"],
        "sampling_seed": 12,
    }
    assert to_sglang(SamplingParams(top_k=5), seed=None)["top_k"] == 5
    assert "sampling_seed" not in to_sglang(SamplingParams(), seed=None)
    assert "stop" not in to_sglang(SamplingParams(), seed=None)
    assert "logit_bias" not in to_sglang(SamplingParams(), seed=None)


def test_banned_tokens_get_the_bias_every_engine_gives_them():
    """A vision model's image tokens: SGLang adds logit_bias (string keys) before sampling and log-probs."""
    from rlcore.vision.inputs import BANNED_LOGIT

    got = to_sglang(SamplingParams(), seed=None, banned=(151655, 151656))
    assert got["logit_bias"] == {"151655": BANNED_LOGIT, "151656": BANNED_LOGIT}


def test_seeds_differ_per_sample_and_prompt():
    params = SamplingParams(n=3, seed=100)
    seeds = [s for i in range(4) for s in request_seeds(params, i)]
    assert seeds == list(range(100, 112))
    assert request_seeds(SamplingParams(n=2), 5) == [None, None]


def test_completion_from_a_result():
    c = to_completion(
        [5, 6],
        result([7, 8, 2], [-0.5, -1.25, -0.1], {"type": "stop", "matched": 2}, "ab"),
        want_log_probs=True,
    )
    assert (c.prompt_ids, c.token_ids, c.log_probs, c.finish_reason, c.text) == (
        [5, 6],
        [7, 8, 2],
        [-0.5, -1.25, -0.1],
        "stop",
        "ab",
    )
    c = to_completion([5], result([9], None, {"type": "length", "length": 1}), want_log_probs=False)
    assert c.finish_reason == "length" and c.log_probs is None


def test_aborted_and_inconsistent_results_raise():
    with pytest.raises(RuntimeError, match=r"rlcore-x-0 ended with finish_reason=.*abort.*: too long"):
        to_completion([5], result([], [], {"type": "abort", "message": "too long"}), want_log_probs=True)
    bad = result([7, 8], [-0.5, -1.0], {"type": "length"})
    bad["meta_info"]["output_token_logprobs"][1] = (-1.0, 99, None)
    with pytest.raises(RuntimeError, match="log-prob 1 is for token 99, but the output has token 8"):
        to_completion([5], bad, want_log_probs=True)
    missing = result([7, 8], None, {"type": "length"})
    with pytest.raises(RuntimeError, match="returned 2 tokens but none log-probs"):
        to_completion([5], missing, want_log_probs=True)

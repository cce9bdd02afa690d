"""HFRollout against independent references: a hand-written greedy loop over the HF model (no
``generate``) and a float64 forward pass over prompt + response."""

import asyncio
import json
import shutil

import attrs
import pytest
import torch
from rlcore.api import RolloutSpec, SamplingParams
from rlcore.devices import get_platform
from rlcore.plugins import registry
from rlcore.rollout.config import HFRolloutConfig
from rlcore.rollout.hf import HFRollout, WeightLoadError
from rlcore.testing.tiny import build_tiny_model
from rlcore.weights import bucketize
from transformers import AutoModelForCausalLM


def make_engine(path, **spec):
    return HFRollout(
        RolloutSpec(model_path=str(path), **spec), HFRolloutConfig(batch_size=4), get_platform("cpu")
    )


@pytest.fixture(scope="module")
def engine(tiny_model):
    return make_engine(tiny_model)


@pytest.fixture(scope="module")
def prompts(engine):
    texts = [
        "What is 3 + 4?",
        "hello",
        "please count the letters of banana and apple, then sort the list and reverse it",
    ]
    return [engine.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def load_hf(path, dtype=torch.float32):
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()


def greedy_reference(model, prompt, max_tokens, eos_ids):
    """Argmax token by token over full forward passes: no KV cache, no generate."""
    ids, out, lps = list(prompt), [], []
    for _ in range(max_tokens):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].double()
        token = int(logits.argmax())
        out.append(token)
        lps.append(float(torch.log_softmax(logits, dim=-1)[token]))
        ids.append(token)
        if token in eos_ids:
            break
    return out, lps


def float64_log_probs(model64, prompt, response, temperature):
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        logits = model64(ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(response)]
    log_probs = torch.log_softmax(logits / temperature, dim=-1)
    return log_probs.gather(-1, torch.tensor(response)[:, None]).squeeze(-1), logits


def test_registered_as_default_plugin():
    entry = registry("rollout_engines").entry("hf")
    assert entry.load() is HFRollout
    assert entry.options["config"] is HFRolloutConfig
    assert entry.plugin == "rlcore.builtin.rollout"


def test_greedy_matches_hand_written_loop(engine, prompts, tiny_model):
    model = load_hf(tiny_model)
    out = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=12))
    for prompt, (completion,) in zip(prompts, out, strict=True):
        tokens, lps = greedy_reference(model, prompt, 12, engine.eos_ids)
        assert completion.prompt_ids == prompt
        assert completion.token_ids == tokens
        assert completion.log_probs == pytest.approx(lps, abs=1e-4)
        assert completion.text == engine.tokenizer.decode(tokens, skip_special_tokens=True)
        assert completion.finish_reason == ("stop" if tokens[-1] in engine.eos_ids else "length")


def test_sampled_log_probs_match_float64_recomputation(engine, prompts, tiny_model):
    model64 = load_hf(tiny_model, torch.float64)
    params = SamplingParams(n=2, temperature=0.7, top_k=5, top_p=0.9, max_tokens=10, seed=3)
    for prompt, group in zip(prompts, engine.generate(prompts, params), strict=True):
        for completion in group:
            want, logits = float64_log_probs(model64, prompt, completion.token_ids, 0.7)
            # log_softmax(logits / T) over the whole vocabulary, before top-k/top-p filtering ...
            assert completion.log_probs == pytest.approx(want.tolist(), abs=1e-4)
            # ... while the filters did restrict what was sampled.
            ranks = (logits > logits.gather(-1, torch.tensor(completion.token_ids)[:, None])).sum(-1)
            assert ranks.max() < 5


def test_n_samples_seeding_and_global_rng(engine, prompts):
    params = SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=11)
    rng_before = torch.get_rng_state()
    first = engine.generate(prompts[:2], params)
    assert torch.equal(torch.get_rng_state(), rng_before)  # the caller's RNG is left alone
    assert [len(group) for group in first] == [3, 3]
    assert all(c.prompt_ids == prompts[i] for i, group in enumerate(first) for c in group)
    assert len({tuple(c.token_ids) for c in first[0]}) > 1  # samples differ
    again = engine.generate(prompts[:2], params)
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in first]
    other = engine.generate(prompts[:2], SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=12))
    assert [[c.token_ids for c in g] for g in other] != [[c.token_ids for c in g] for g in first]


def test_left_padding_gives_each_prompt_its_solo_output(engine, prompts):
    params = SamplingParams(temperature=0, max_tokens=8)
    together = engine.generate(prompts, params)  # lengths differ: rows are left-padded
    assert len({len(p) for p in prompts}) == len(prompts)
    for prompt, (completion,) in zip(prompts, together, strict=True):
        (alone,) = engine.generate([prompt], params)[0]
        assert completion.token_ids == alone.token_ids
        assert completion.log_probs == pytest.approx(alone.log_probs, abs=1e-5)


def test_chunking_keeps_prompt_order(engine, prompts):
    # batch_size=4 with 3 prompts x 3 samples: three generate calls, results regrouped per prompt.
    out = engine.generate(prompts, SamplingParams(n=3, temperature=0, max_tokens=4))
    for prompt, group in zip(prompts, out, strict=True):
        (alone,) = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=4))[0]
        assert [c.token_ids for c in group] == [alone.token_ids] * 3


def test_max_tokens_and_max_model_len(engine, prompts, tiny_model):
    (c,) = engine.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=5))[0]
    assert len(c.token_ids) == 5 and c.finish_reason == "length"
    assert len(c.log_probs) == 5
    # Like vLLM and SGLang (rlcore.api.check_prompts): a request that cannot fit is refused, not cut short.
    short = make_engine(tiny_model, max_model_len=len(prompts[0]) + 3)
    (c,) = short.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=3))[0]
    assert len(c.token_ids) == 3 and c.finish_reason == "length"
    with pytest.raises(ValueError, match=r"hf rollout: prompt 0 .*max_tokens=5.*at most 3 new tokens fit"):
        short.generate([prompts[0]], SamplingParams(max_tokens=5))


def first_containing(tokenizer, tokens, stop):
    """Shortest prefix whose text contains ``stop``, by linear scan."""
    for k in range(1, len(tokens) + 1):
        if stop in tokenizer.decode(tokens[:k], skip_special_tokens=True):
            return k
    return None


def test_stop_strings(engine, prompts):
    base = SamplingParams(n=2, temperature=1.0, max_tokens=24, seed=5)
    full = engine.generate(prompts[:2], base)
    text = full[0][0].text
    start = next(i for i in range(len(text) // 2, len(text) - 3) if "\ufffd" not in text[i : i + 3])
    stop = text[start : start + 3]
    cut = engine.generate(prompts[:2], attrs.evolve(base, stop=(stop,)))
    hits = 0
    for group_full, group_cut in zip(full, cut, strict=True):
        for whole, c in zip(group_full, group_cut, strict=True):
            k = first_containing(engine.tokenizer, whole.token_ids, stop)
            if k is None:
                assert c.token_ids == whole.token_ids and c.finish_reason == whole.finish_reason
                continue
            hits += 1
            assert c.token_ids == whole.token_ids[:k]
            assert c.log_probs == whole.log_probs[:k]
            assert c.finish_reason == "stop"
            assert c.text == whole.text[: whole.text.find(stop)]
    assert hits >= 1


def test_eos_ends_the_response(tiny_model, tmp_path, prompts):
    model = load_hf(tiny_model)
    greedy, _ = greedy_reference(model, prompts[0], 12, [])
    stop_token = greedy[3]
    path = tmp_path / "eos_model"
    shutil.copytree(tiny_model, path)
    config = json.loads((path / "generation_config.json").read_text())
    config["eos_token_id"] = [config["eos_token_id"], stop_token]
    (path / "generation_config.json").write_text(json.dumps(config))
    engine = make_engine(path)
    (c,) = engine.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=12))[0]
    end = greedy.index(stop_token) + 1
    assert c.token_ids == greedy[:end]  # the eos token is kept
    assert c.finish_reason == "stop"
    assert c.text == engine.tokenizer.decode(greedy[:end], skip_special_tokens=True)


def test_load_weights_matches_a_model_with_those_weights(tiny_model, tmp_path, prompts):
    other = build_tiny_model(tmp_path / "other", seed=1)
    engine = make_engine(tiny_model)
    params = SamplingParams(temperature=0, max_tokens=8)
    before = engine.generate(prompts[:1], params)[0][0].token_ids
    reference = load_hf(other)
    # A small bucket splits the embedding (1 MB) across buckets; named_parameters drops the tied lm_head.
    engine.load_weights(bucketize(reference.named_parameters(), bucket_bytes=64 * 1024))
    want, want_lps = greedy_reference(reference, prompts[0], 8, engine.eos_ids)
    (c,) = engine.generate(prompts[:1], params)[0]
    assert c.token_ids == want != before
    assert c.log_probs == pytest.approx(want_lps, abs=1e-4)


def test_load_weights_tied_names_and_dtype_cast(tiny_model):
    engine = make_engine(tiny_model)
    embed = engine.model.get_input_embeddings().weight
    new = torch.randn(embed.shape, dtype=torch.float64)
    engine.load_weights([[("lm_head.weight", new)]])  # the tied name updates the shared tensor
    assert torch.equal(embed.detach(), new.float())
    with pytest.raises(WeightLoadError, match="ties"):
        engine.load_weights([[("lm_head.weight", new), ("model.embed_tokens.weight", new + 1)]])
    assert torch.equal(embed.detach(), new.float())


def test_bad_stream_is_rejected_and_nothing_applied(tiny_model, prompts):
    engine = make_engine(tiny_model)
    params = SamplingParams(temperature=0, max_tokens=6)
    before = engine.generate(prompts[:1], params)[0][0]
    norm = engine.model.state_dict()["model.norm.weight"].clone()
    changed = ("model.norm.weight", norm * 3)
    with pytest.raises(WeightLoadError, match="'model.layers.0.self_attn.q_proj.weight'") as info:
        engine.load_weights([[changed], [("model.layers.0.self_attn.q_proj.wieght", torch.zeros(256, 256))]])
    assert "nothing was loaded" in str(info.value)
    with pytest.raises(WeightLoadError, match=r"shape \(3,\)"):
        engine.load_weights([[changed, ("model.norm.weight", torch.zeros(3))]])
    with pytest.raises(ValueError, match="incomplete"):
        engine.load_weights([[changed], list(bucketize([("model.norm.weight", norm)], 256))[0]])
    assert torch.equal(engine.model.state_dict()["model.norm.weight"], norm)
    after = engine.generate(prompts[:1], params)[0][0]
    assert after.token_ids == before.token_ids


def test_release_and_resume(tiny_model, prompts):
    engine = make_engine(tiny_model)
    params = SamplingParams(temperature=0, max_tokens=4)
    before = engine.generate(prompts[:1], params)[0][0].token_ids
    engine.release(["weights", "kv_cache"])
    with pytest.raises(RuntimeError, match="resume"):
        engine.generate(prompts[:1], params)
    engine.resume(["weights", "kv_cache"])
    assert engine.generate(prompts[:1], params)[0][0].token_ids == before
    with pytest.raises(ValueError, match="valid tags: weights, kv_cache"):
        engine.release(["optimizer"])


def test_agenerate_runs_requests_concurrently(engine, prompts):
    params = SamplingParams(n=2, temperature=1.0, max_tokens=6, seed=4)

    async def both():
        return await asyncio.gather(*(engine.agenerate(p, params) for p in prompts[:2]))

    results = asyncio.run(both())
    for prompt, got in zip(prompts[:2], results, strict=True):
        want = engine.generate([prompt], params)[0]
        assert [c.token_ids for c in got] == [c.token_ids for c in want]


def test_bad_prompts_and_params(engine, prompts):
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.generate([prompts[0], []], SamplingParams())
    with pytest.raises(ValueError, match="token id 5000 outside"):
        engine.generate([[1, 5000]], SamplingParams())
    with pytest.raises(ValueError, match="top_p"):
        engine.generate(prompts[:1], SamplingParams(top_p=0.0))
    with pytest.raises(ValueError, match="rollout.dtype"):
        make_engine(engine.spec.model_path, dtype="fp8")


def test_logprobs_off(engine, prompts):
    (c,) = engine.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=3, logprobs=False))[0]
    assert c.log_probs is None and len(c.token_ids) == 3

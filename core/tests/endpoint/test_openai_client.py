"""The chat endpoint served by the HF rollout, called by agents written with the real ``openai`` client.

Every sampled turn of a trained row must be, token for token, what the engine returned for exactly the
prefix before it (a spy on the engine keeps each call), and its behaviour log-probs must equal a float64
recomputation with the HF model. The agents send back the decoded text of each reply, which re-tokenizes
to other ids for this random model: a row built from the text would not pass.
"""

from __future__ import annotations

import pytest
import torch
from rlcore.agents.config import AgentConfig
from rlcore.api import RolloutSpec, SamplingParams
from rlcore.devices import get_platform
from rlcore.endpoint.programs import AgentPrograms, EpisodeTask
from rlcore.endpoint.server import ChatEndpoint
from rlcore.rollout.hf import HFRollout
from rlcore.testing import openai_agents
from rlcore.testing.openai_agents import EngineSpy, assert_exactly_sampled, float64_log_probs, sampled_spans
from transformers import AutoModelForCausalLM, AutoTokenizer

openai = pytest.importorskip("openai")

MAX_MODEL_LEN = 512
AGENT = "rlcore.testing.openai_agents:scripted_agent"
#: fp32 rollout against the float64 model (measured about 1e-6 on this model).
LOGPROB_ATOL = 1e-4


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    return AutoTokenizer.from_pretrained(str(tiny_model_path))


@pytest.fixture(scope="module")
def endpoint(tiny_model_path, tokenizer):
    engine = HFRollout(
        RolloutSpec(model_path=str(tiny_model_path), max_model_len=MAX_MODEL_LEN), None, get_platform("cpu")
    )
    served = ChatEndpoint(EngineSpy(engine), tokenizer, SamplingParams()).start()
    yield served
    served.close()
    engine.shutdown()


@pytest.fixture(scope="module")
def reference(tiny_model_path):
    return AutoModelForCausalLM.from_pretrained(str(tiny_model_path), dtype=torch.float64).eval()


def tasks(tokenizer, scripts):
    out = []
    for k, script in enumerate(scripts):
        messages = [{"role": "user", "content": f"What is {k} + 2?"}]
        ids = tokenizer.encode(
            tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        )
        out.append(EpisodeTask(ids, {"prompt": messages, "extra_info": {"script": script}}))
    return out


def run(endpoint, scripts, tokenizer, n=1, max_tokens=96, **agent):
    endpoint.engine.calls.clear()
    programs = AgentPrograms(endpoint, AgentConfig(program=AGENT, max_turns=8, **agent), MAX_MODEL_LEN)
    groups = programs.run(tasks(tokenizer, scripts), SamplingParams(n=n, max_tokens=max_tokens, seed=7))
    return [c for group in groups for c in group]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_echoing_agents_train_exactly_the_sampled_tokens(endpoint, tokenizer, reference, stream):
    rows = run(endpoint, [{"turns": 3, "stream": stream}] * 3, tokenizer, n=2)
    assert len(rows) == 6 and {r.info["stop_reason"] for r in rows} == {"answer"}
    retokenized_differs = 0
    for row in rows:
        assert row.info["turns"] == 3 and row.info["history_edits"] == 0
        assert row.info["returned"] == {"score": 3.0, "contents": row.info["returned"]["contents"]}
        assert_exactly_sampled(row, endpoint.engine.calls)
        mask = torch.tensor(row.response_mask, dtype=torch.bool)
        expected = float64_log_probs(reference, row)[mask]
        assert torch.allclose(
            torch.tensor(row.log_probs, dtype=torch.float64)[mask], expected, atol=LOGPROB_ATOL
        )
        for start, end in sampled_spans(row):
            text = tokenizer.decode(row.token_ids[start:end], skip_special_tokens=True)
            retokenized_differs += tokenizer.encode(text) != row.token_ids[start:end]
    assert retokenized_differs > 0  # what the agents sent back would not have given the sampled ids


def test_an_agent_that_edits_an_earlier_turn_is_split_and_counted(endpoint, tokenizer):
    (row,) = run(endpoint, [{"turns": 3, "edit_at": 2}], tokenizer)
    assert row.info["history_edits"] == 1 and row.info["dropped_tokens"] > 0
    assert row.info["retokenized_tokens"] > 0 and row.info["turns"] == 2  # the first turn and the last
    assert_exactly_sampled(row, endpoint.engine.calls)
    contexts = tokenizer.decode([t for t, m in zip(row.token_ids, row.response_mask, strict=True) if not m])
    assert "(edited)" in contexts  # the edited text is context the model reads, never trained on


def test_a_hanging_agent_times_out_and_the_others_finish(endpoint, tokenizer):
    rows = run(endpoint, [{"turns": 3, "hang_after": 1}, {"turns": 2}], tokenizer, episode_timeout_s=3)
    hung, fine = rows
    assert hung.info["stop_reason"] == "timeout" and hung.info["returned"] is None
    assert hung.info["turns"] == 1 and sum(hung.response_mask) > 0  # what it sampled is kept
    assert fine.info["stop_reason"] == "answer" and fine.info["turns"] == 2
    # Its episode is closed: a late request is refused.
    client = openai.OpenAI(
        base_url=endpoint.base_url(hung.info["episode_id"]), api_key=endpoint.api_key, max_retries=0
    )
    with pytest.raises(openai.ConflictError, match="has finished"):
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])


def test_requests_without_the_runs_token_or_an_open_episode_are_refused(endpoint):
    episode = endpoint.open("probe", seed=1, budget=32, max_model_len=MAX_MODEL_LEN, max_turns=4)
    try:
        wrong = openai.OpenAI(base_url=endpoint.base_url("probe"), api_key="not-the-token", max_retries=0)
        with pytest.raises(openai.AuthenticationError, match="API key"):
            wrong.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        assert episode.requests == 0
        shared = openai.OpenAI(base_url=f"{endpoint.url}/v1", api_key=endpoint.api_key, max_retries=0)
        with pytest.raises(openai.BadRequestError, match="no episode"):
            shared.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.NotFoundError, match="not open"):
            shared.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "hi"}], user="nope"
            )
        with pytest.raises(openai.BadRequestError, match="frequency_penalty"):
            shared.chat.completions.create(
                model="policy",
                messages=[{"role": "user", "content": "hi"}],
                user="probe",
                frequency_penalty=1.0,
            )
        # The episode may also be named by the header or the user field on the shared route.
        reply = shared.chat.completions.create(
            model="policy",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=3,
            extra_headers={"X-Rlcore-Episode": "probe"},
        )
        assert reply.usage.completion_tokens == len(episode.final.turns[0].ids) <= 3 and episode.requests == 1
    finally:
        endpoint.finish("probe")


def test_many_concurrent_episodes_finish_within_the_bound(endpoint, tokenizer):
    openai_agents.CONCURRENCY.update(now=0, peak=0)
    rows = run(endpoint, [{"turns": 2, "max_tokens": 3}] * 6, tokenizer, n=2, max_concurrent_episodes=4)
    assert len(rows) == 12 and all(r.info["stop_reason"] == "answer" and r.info["turns"] == 2 for r in rows)
    assert openai_agents.CONCURRENCY["peak"] == 4
    assert len({r.info["episode_id"] for r in rows}) == 12
    for row in rows:
        assert_exactly_sampled(row, endpoint.engine.calls)


def test_an_agent_past_its_budget_ends_with_budget(endpoint, tokenizer):
    (row,) = run(endpoint, [{"turns": 5, "max_tokens": 20}], tokenizer, max_tokens=30)
    assert row.info["stop_reason"] == "budget" and "max_response_length=30" in row.info["error"]
    assert len(row.token_ids) <= 30

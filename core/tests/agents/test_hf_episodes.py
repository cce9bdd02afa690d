"""Episodes on a real engine: the HF rollout serving a tiny Qwen2 model that was taught (in this test,
by a few hundred steps of supervised training on one solving episode) to call the calculator.

Checked: the batch's ids equal the engine's output ids turn by turn, the observation between turns is the
chat template's delta, the mask is 0 exactly on it, the rollout log-probs of model tokens equal a
teacher-forced forward pass of the same model over the batch row (so no id was re-tokenized), and the
rollout worker's ``run_episodes`` (the path a run takes) gives the same episode.
"""

from __future__ import annotations

import asyncio

import attrs
import pytest
import torch
from rlcore.agents import AgentConfig, build_tools
from rlcore.agents.builtin_tools import Calculator
from rlcore.agents.episode import AgentLoop, EpisodeLimits
from rlcore.agents.observations import Observations
from rlcore.api import RolloutSpec, SamplingParams
from rlcore.cluster.workers import RolloutWorker
from rlcore.devices import get_platform
from rlcore.rollout.batching import completions_to_batch
from rlcore.rollout.config import HFRolloutConfig
from rlcore.rollout.hf import HFRollout
from rlcore.tasks import tool_add
from rlcore.testing.tiny import build_tiny_model
from transformers import AutoModelForCausalLM, AutoTokenizer

A, B = 4821, 9033
C, D = 1215, 8687
MAX_LEN = 256


def render(tokenizer, messages):
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


@pytest.fixture(scope="module")
def taught_model(tmp_path_factory):
    """The tiny model after supervised steps on two solving episodes: ``A + B`` with the calculator and
    ``C + D`` with the python tool. Returns its folder and the two prompts."""
    torch.set_num_threads(1)
    path = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    prompts, rows = [], []
    for (a, b), tool in (((A, B), "calculator"), ((C, D), "python")):
        prompt = render(tokenizer, [{"role": "user", "content": tool_add.request(a, b)}])
        response = tokenizer.encode(tool_add.episode_text(a, b, tool), add_special_tokens=False)
        prompts.append(prompt)
        rows.append((prompt, [*response, tokenizer.eos_token_id]))
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((2, width), tokenizer.pad_token_id)
    labels = torch.full((2, width), -100)
    for k, (prompt, response) in enumerate(rows):
        ids[k, : len(prompt) + len(response)] = torch.tensor(prompt + response)
        labels[k, len(prompt) : len(prompt) + len(response)] = torch.tensor(response)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    torch.manual_seed(0)
    for _ in range(400):
        loss = model(input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id).long(), labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 1e-3:
            break
    out = tmp_path_factory.mktemp("taught") / "model"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out), prompts


@pytest.fixture(scope="module")
def engine(taught_model):
    path, _ = taught_model
    rollout = HFRollout(
        RolloutSpec(model_path=path, max_model_len=MAX_LEN),
        HFRolloutConfig(batch_size=8),
        get_platform("cpu"),
    )
    yield rollout
    rollout.shutdown()


class Recorder:
    """Passes requests to the engine and keeps what it returned, per request."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    async def agenerate(self, prompt, params):
        out = await self.engine.agenerate(prompt, params)
        self.calls.append((list(prompt), out[0]))
        return out


def test_greedy_episode_calls_the_calculator_and_keeps_every_id(taught_model, engine):
    path, (prompt, _) = taught_model
    tokenizer = AutoTokenizer.from_pretrained(path)
    recorder = Recorder(engine)
    loop = AgentLoop(
        recorder,
        tokenizer,
        {"calculator": Calculator()},
        EpisodeLimits(max_turns=3, max_model_len=MAX_LEN),
        Observations(tokenizer, 16),
    )
    (group,) = loop.run([prompt], SamplingParams(n=1, temperature=0.0, max_tokens=120, seed=0))
    c = group[0]
    assert c.info["tool_calls"] == 1 and c.info["tool_errors"] == 0, tokenizer.decode(c.token_ids)
    assert c.info["final_text"] == str(A + B) and c.info["stop_reason"] == "answer"

    (p1, turn1), (p2, turn2) = recorder.calls
    observation = tokenizer.encode(
        f"\n<|im_start|>tool\n{A + B}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    assert p1 == prompt and p2 == prompt + turn1.token_ids + observation
    batch = completions_to_batch([c], tokenizer.pad_token_id)
    R = batch["responses"].shape[1]
    n1, n2, no = len(turn1.token_ids), len(turn2.token_ids), len(observation)
    assert batch["responses"][0].tolist() == turn1.token_ids + observation + turn2.token_ids
    assert batch["response_mask"][0].tolist() == [1] * n1 + [0] * no + [1] * n2 and R == n1 + no + n2
    rollout_lp = batch["rollout_log_probs"][0]
    assert rollout_lp[:n1].tolist() == pytest.approx(turn1.log_probs)
    assert rollout_lp[n1 + no :].tolist() == pytest.approx(turn2.log_probs)

    # Teacher forcing over the batch row reproduces the rollout's log-probs of every model token.
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    P = batch["prompts"].shape[1]
    forward = torch.log_softmax(logits[0, P - 1 : P - 1 + R].float(), -1).gather(
        -1, batch["responses"][0, :, None]
    )[:, 0]
    model_tokens = batch["response_mask"][0].bool()
    torch.testing.assert_close(forward[model_tokens], rollout_lp[model_tokens], atol=2e-4, rtol=0)


def test_sampled_episodes_in_flight_and_the_worker_path_agree(taught_model, engine):
    path, (prompt, _) = taught_model
    tokenizer = AutoTokenizer.from_pretrained(path)
    params = SamplingParams(n=3, temperature=1.0, max_tokens=120, seed=11)
    limits = EpisodeLimits(max_turns=3, max_model_len=MAX_LEN)
    loop = AgentLoop(engine, tokenizer, {"calculator": Calculator()}, limits, Observations(tokenizer, 16))
    direct = loop.run([prompt, prompt], params)

    worker = RolloutWorker(
        "hf", RolloutSpec(model_path=path, max_model_len=MAX_LEN), HFRolloutConfig(batch_size=8), device="cpu"
    )
    try:
        agent = AgentConfig(enabled=True, tools=["calculator"], max_turns=3, max_tool_response_tokens=16)
        via_worker = worker.run_episodes([prompt, prompt], params, agent, path)
    finally:
        worker.shutdown()
    # Same seeds, same engine weights: the same episodes, sample by sample.
    for g1, g2 in zip(direct, via_worker, strict=True):
        for c1, c2 in zip(g1, g2, strict=True):
            assert c1.token_ids == c2.token_ids and c1.response_mask == c2.response_mask
    batch = completions_to_batch(direct, tokenizer.pad_token_id)
    mask, attention = batch["response_mask"], batch["attention_mask"][:, batch["prompts"].shape[1] :]
    assert bool((mask <= attention).all())
    for row, c in enumerate(g for group in direct for g in group):
        zeros = [t for t, m in enumerate(c.response_mask) if m == 0]
        # Observation tokens are exactly the template's tool messages (nothing the model sampled).
        if c.info["tool_calls"]:
            assert zeros and "<|im_start|>tool" in tokenizer.decode([c.token_ids[t] for t in zeros])
        assert bool((batch["rollout_log_probs"][row][mask[row] == 0] == 0).all())


def test_agent_loop_uses_only_agenerate(taught_model, engine):
    path, (prompt, _) = taught_model
    tokenizer = AutoTokenizer.from_pretrained(path)

    class OnlyAsync:
        async def agenerate(self, prompt, params):
            return await engine.agenerate(prompt, params)

    loop = AgentLoop(
        OnlyAsync(),
        tokenizer,
        {"calculator": Calculator()},
        EpisodeLimits(2, MAX_LEN),
        Observations(tokenizer, 16),
    )
    out = asyncio.run(loop.episode(prompt, attrs.evolve(SamplingParams(max_tokens=60), temperature=0.0)))
    assert out.token_ids and len(out.token_ids) <= 60


def test_python_tool_runs_in_the_sandbox_within_an_episode(taught_model, engine):
    path, (_, prompt) = taught_model
    tokenizer = AutoTokenizer.from_pretrained(path)
    recorder = Recorder(engine)
    tools = build_tools(["calculator", "python"])
    loop = AgentLoop(recorder, tokenizer, tools, EpisodeLimits(3, MAX_LEN), Observations(tokenizer, 16))
    try:
        (group,) = loop.run([prompt], SamplingParams(n=1, temperature=0.0, max_tokens=120, seed=0))
    finally:
        loop.close()
    c = group[0]
    assert c.info["tool_calls"] == 1 and c.info["tool_errors"] == 0, tokenizer.decode(c.token_ids)
    assert '"name": "python"' in tokenizer.decode(recorder.calls[0][1].token_ids)
    (_, turn1), (p2, _) = recorder.calls
    # The program's output, newline included, as the tool message.
    observation = tokenizer.encode(
        f"\n<|im_start|>tool\n{C + D}\n<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    assert p2 == prompt + turn1.token_ids + observation
    assert c.info["final_text"] == str(C + D)

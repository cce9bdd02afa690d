"""Episodes over a scripted engine: the exact ids, masks and log-probs of every turn, the observation
delta the chat template renders, the stop conditions, seeds, and many episodes in flight."""

import asyncio
import json

import attrs
import pytest
from rlcore.agents.builtin_tools import Calculator
from rlcore.agents.episode import AgentLoop, EpisodeLimits, turn_seed
from rlcore.agents.observations import Observations
from rlcore.api import Completion, RolloutEngine, RolloutSpec, SamplingParams, request_seeds
from rlcore.rollout.batching import completions_to_batch


def call_text(expression):
    body = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    return f"<tool_call>{body}</tool_call>"


class ScriptedEngine(RolloutEngine):
    """Answers turn ``k`` of an episode with ``turns[k]`` (text, tokenized, eos appended), with
    log-probs ``-(position + 1) / 100``; records every request. ``gate``: requests wait until that many
    are in flight at once (proves concurrency)."""

    def __init__(self, tokenizer, turns, *, gate=0, finish="stop"):
        super().__init__(RolloutSpec(model_path="scripted", max_model_len=4096), None, None)
        self.tokenizer, self.turns, self.finish = tokenizer, turns, finish
        self.requests: list[tuple[list[int], SamplingParams]] = []
        self.outputs: list[list[int]] = []
        self.gate, self.waiting, self.peak = gate, 0, 0

    def generate(self, prompts, params):
        raise AssertionError("the agent loop must only use agenerate")

    async def agenerate(self, prompt, params):
        self.requests.append((list(prompt), params))
        self.waiting += 1
        self.peak = max(self.peak, self.waiting)
        while self.gate and self.peak < self.gate:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0)
        self.waiting -= 1
        # Each observation ends with the next turn's generation prompt: count them to know the turn.
        turn = self.tokenizer.decode(list(prompt)).count("<|im_start|>assistant") - 1
        ids = self.tokenizer.encode(self.turns[min(turn, len(self.turns) - 1)], add_special_tokens=False)
        ids = [*ids, self.tokenizer.eos_token_id]
        finish = self.finish
        if len(ids) > params.max_tokens:
            ids, finish = ids[: params.max_tokens], "length"
        self.outputs.append(ids)
        log_probs = [-(i + 1) / 100 for i in range(len(ids))]
        return [Completion(list(prompt), ids, log_probs if params.logprobs else None, finish, "")]

    def load_weights(self, buckets):
        pass

    def release(self, tags):
        pass

    def resume(self, tags):
        pass


def make_loop(tokenizer, engine, *, max_turns=4, max_model_len=4096, max_tool_tokens=64, concurrent=256):
    return AgentLoop(
        engine,
        tokenizer,
        {"calculator": Calculator()},
        EpisodeLimits(max_turns=max_turns, max_model_len=max_model_len),
        Observations(tokenizer, max_tool_tokens),
        max_concurrent=concurrent,
    )


def prompt_ids(tokenizer, text="What is 48213 + 90331?"):
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer.encode(rendered, add_special_tokens=False)


def test_two_turns_keep_the_engine_ids_and_mask_the_observation(tokenizer):
    engine = ScriptedEngine(tokenizer, [call_text("48213 + 90331"), "138544"])
    loop = make_loop(tokenizer, engine)
    prompt = prompt_ids(tokenizer)
    (group,) = loop.run([prompt], SamplingParams(n=1, max_tokens=200, seed=7))
    (c,) = group
    turn1, turn2 = engine.outputs
    # What the template puts between the two turns, rendered alone: the tool message and the next prompt.
    observation = tokenizer.encode(
        "\n<|im_start|>tool\n138544<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    assert c.prompt_ids == prompt
    assert c.token_ids == turn1 + observation + turn2
    assert c.response_mask == [1] * len(turn1) + [0] * len(observation) + [1] * len(turn2)
    expected_lp = [-(i + 1) / 100 for i in range(len(turn1))] + [0.0] * len(observation)
    assert c.log_probs == expected_lp + [-(i + 1) / 100 for i in range(len(turn2))]
    # The second request continues the exact ids, not a re-tokenized history.
    assert engine.requests[1][0] == prompt + turn1 + observation
    assert c.finish_reason == "stop"
    assert c.info == {
        "turns": 2,
        "tool_calls": 1,
        "tool_errors": 0,
        "stop_reason": "answer",
        "final_text": "138544",
    }
    assert c.text.endswith("138544") and "tool\n138544" in c.text
    # Budgets: the second turn may use what the first and the observation left.
    assert engine.requests[0][1].max_tokens == 200
    assert engine.requests[1][1].max_tokens == 200 - len(turn1) - len(observation)


def test_batch_of_episodes_keeps_masks_and_zero_log_probs_on_tool_tokens(tokenizer):
    engine = ScriptedEngine(tokenizer, [call_text("1 + 1"), "2"])
    loop = make_loop(tokenizer, engine)
    groups = loop.run([prompt_ids(tokenizer)], SamplingParams(n=2, max_tokens=200, seed=1))
    batch = completions_to_batch(groups, tokenizer.pad_token_id)
    for row, c in enumerate(groups[0]):
        r = len(c.token_ids)
        assert batch["responses"][row, :r].tolist() == c.token_ids
        assert batch["response_mask"][row, :r].tolist() == c.response_mask
        assert batch["attention_mask"][row, -batch["responses"].shape[1] :][:r].tolist() == [1] * r
        lp = batch["rollout_log_probs"][row, :r]
        assert bool((lp[batch["response_mask"][row, :r] == 0] == 0).all())
    assert batch.objects["agent_info"][0]["tool_calls"] == 1


def test_turn_limit_stops_before_running_the_last_call(tokenizer):
    engine = ScriptedEngine(tokenizer, [call_text("1 + 1")])
    (group,) = make_loop(tokenizer, engine, max_turns=2).run(
        [prompt_ids(tokenizer)], SamplingParams(max_tokens=500)
    )
    c = group[0]
    assert c.info["turns"] == 2 and c.info["tool_calls"] == 1 and c.info["stop_reason"] == "max_turns"
    assert c.token_ids[-len(engine.outputs[-1]) :] == engine.outputs[-1]  # ends with the unrun call
    assert c.response_mask[-1] == 1


def test_budget_counts_tool_tokens_and_cuts_the_last_turn(tokenizer):
    engine = ScriptedEngine(tokenizer, [call_text("1 + 1")])
    (group,) = make_loop(tokenizer, engine, max_turns=10).run(
        [prompt_ids(tokenizer)], SamplingParams(max_tokens=150)
    )
    c = group[0]
    assert len(c.token_ids) <= 150
    assert c.finish_reason == "length" and c.info["stop_reason"] in ("length", "budget")
    assert sum(c.response_mask) == sum(len(o) for o in engine.outputs)


def test_max_model_len_bounds_the_response(tokenizer):
    prompt = prompt_ids(tokenizer)
    engine = ScriptedEngine(tokenizer, [call_text("1 + 1")])
    loop = make_loop(tokenizer, engine, max_turns=10, max_model_len=len(prompt) + 100)
    (group,) = loop.run([prompt], SamplingParams(max_tokens=1000))
    assert len(group[0].token_ids) <= 100
    assert all(len(p) + params.max_tokens <= len(prompt) + 100 for p, params in engine.requests)


def test_tool_output_is_cut_to_its_token_limit(tokenizer):
    engine = ScriptedEngine(tokenizer, [call_text("7 ** 300"), "done"])
    (group,) = make_loop(tokenizer, engine, max_tool_tokens=5).run(
        [prompt_ids(tokenizer)], SamplingParams(max_tokens=400)
    )
    text = tokenizer.decode(group[0].token_ids)
    assert "...(truncated)" in text and str(7**300) not in text


def test_bad_calls_become_error_messages_the_model_reads(tokenizer):
    engine = ScriptedEngine(
        tokenizer,
        ['<tool_call>{"name": "calculator", "arguments": {"expression": "import os"}}</tool_call>', "ok"],
    )
    (group,) = make_loop(tokenizer, engine).run([prompt_ids(tokenizer)], SamplingParams(max_tokens=400))
    c = group[0]
    assert c.info["tool_errors"] == 1 and c.info["stop_reason"] == "answer"
    assert "Error: CalculatorError" in tokenizer.decode(engine.requests[1][0])


def test_seeds_follow_request_seeds_per_sample_and_differ_per_turn(tokenizer):
    engine = ScriptedEngine(tokenizer, [call_text("1 + 1"), "2"])
    params = SamplingParams(n=3, max_tokens=300, seed=100)
    prompts = [prompt_ids(tokenizer, "a"), prompt_ids(tokenizer, "b")]
    make_loop(tokenizer, engine).run(prompts, params)
    first_turn = sorted(p.seed for ids, p in engine.requests if ids in prompts)
    assert first_turn == sorted(request_seeds(params, 0) + request_seeds(params, 1))
    later = [p.seed for ids, p in engine.requests if ids not in prompts]
    assert sorted(later) == sorted(turn_seed(s, 1) for s in first_turn)
    assert len(set(later) | set(first_turn)) == 12
    assert turn_seed(None, 3) is None


def test_many_episodes_are_in_flight_at_once(tokenizer):
    engine = ScriptedEngine(tokenizer, ["4"], gate=16)
    groups = make_loop(tokenizer, engine).run([prompt_ids(tokenizer)] * 4, SamplingParams(n=4, max_tokens=20))
    assert engine.peak >= 16 and len(groups) == 4 and all(len(g) == 4 for g in groups)


def test_concurrency_limit_is_respected(tokenizer):
    engine = ScriptedEngine(tokenizer, ["4"])
    make_loop(tokenizer, engine, concurrent=3).run(
        [prompt_ids(tokenizer)] * 5, SamplingParams(n=2, max_tokens=20)
    )
    assert engine.peak <= 3


def test_observation_after_a_turn_without_eos_closes_the_turn(tokenizer):
    obs = Observations(tokenizer, 64)
    from rlcore.agents.tools import ToolResult

    message = obs.message(ToolResult("calculator", "5"))
    with_eos = obs.ids([message], [11, tokenizer.eos_token_id])
    without = obs.ids([message], [11])
    assert tokenizer.decode(without) == "<|im_end|>\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(with_eos) == "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"


def test_no_log_probs_requested_gives_none(tokenizer):
    engine = ScriptedEngine(tokenizer, [call_text("1 + 1"), "2"])
    (group,) = make_loop(tokenizer, engine).run(
        [prompt_ids(tokenizer)], attrs.evolve(SamplingParams(max_tokens=300), logprobs=False)
    )
    assert group[0].log_probs is None


def test_episode_refuses_n_above_one(tokenizer):
    loop = make_loop(tokenizer, ScriptedEngine(tokenizer, ["x"]))
    with pytest.raises(ValueError, match="n=2"):
        asyncio.run(loop.episode([1, 2], SamplingParams(n=2)))

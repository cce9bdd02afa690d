"""Partial rollouts with the real HF rollout engine: a response continued across a weight update carries
both policy versions, and every log-prob it reports is the float64 log-prob, under the weights of the
version that sampled the token, of that token."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from rlcore.api import Completion, RolloutSpec, SamplingParams
from rlcore.devices import get_platform
from rlcore.rollout.batching import completions_to_batch
from rlcore.rollout.config import HFRolloutConfig
from rlcore.rollout.hf import HFRollout
from rlcore.rollout.partial import PolicyClock, VersionedRollout
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

TEMPERATURE = 0.8


class Role:
    """The rollout role's face (``generate`` over one engine) with a hook after each call."""

    def __init__(self, engine, after_call=None):
        self.engine, self.after_call, self.calls = engine, after_call, 0

    def generate(self, prompts, params):
        out = self.engine.generate(prompts, params)
        self.calls += 1
        if self.after_call is not None:
            self.after_call(self.calls)
        return out


def perturbed(weights: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in weights.items()}


def float64_log_probs(model, weights, completion: Completion) -> list[float]:
    """Log-prob of each response token under ``weights``, in float64, at the sampling temperature."""
    model.load_state_dict({k: v.double() for k, v in weights.items()}, strict=False)
    ids = torch.tensor([completion.prompt_ids + completion.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(completion.prompt_ids) - 1 : -1].double()
    lp = torch.log_softmax(logits / TEMPERATURE, -1)
    return lp.gather(-1, torch.tensor(completion.token_ids)[:, None])[:, 0].tolist()


@pytest.fixture(scope="module")
def engine(tiny_model):
    return HFRollout(RolloutSpec(model_path=tiny_model), HFRolloutConfig(), get_platform("cpu"))


def test_a_response_continued_across_a_weight_update_has_both_versions_and_exact_log_probs(
    engine, tiny_model
):
    v0 = load_file(f"{tiny_model}/model.safetensors")
    v1 = perturbed(v0, seed=1)
    engine.load_weights([sorted(v0.items())])
    clock = PolicyClock(0)

    def hold_until_a_sync_waits(calls):
        # After the first chunk, wait (holding the rollout) until the sync below is waiting: it then goes
        # before the second chunk, as a sync arriving mid-generation would.
        if calls == 1:
            first_chunk_done.set()
            while not clock.sync_pending:
                time.sleep(0.01)

    first_chunk_done = threading.Event()
    rollout = VersionedRollout(Role(engine, hold_until_a_sync_waits), clock, chunk_tokens=4)
    params = SamplingParams(n=2, temperature=TEMPERATURE, max_tokens=12, seed=7)
    prompts = [[3, 14, 15, 9, 2], [6, 5, 35]]
    result: list = []
    worker = threading.Thread(target=lambda: result.append(rollout.generate(prompts, params)))
    worker.start()
    assert first_chunk_done.wait(120)
    with clock.syncing():  # the trainer's weight sync
        engine.load_weights([sorted(v1.items())])
        clock.advance(1)
    worker.join(300)
    (groups,) = result

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float64)
    by_version = {0: v0, 1: v1}
    spanning = 0
    for prompt, group in zip(prompts, groups, strict=True):
        assert len(group) == 2
        for c in group:
            assert c.prompt_ids == prompt and len(c.versions) == len(c.token_ids) == len(c.log_probs)
            assert c.versions == sorted(c.versions) and set(c.versions) <= {0, 1}
            assert c.versions[: min(4, len(c.versions))] == [0] * min(4, len(c.versions))
            spanning += len(set(c.versions)) == 2
            reference = {v: float64_log_probs(model, w, c) for v, w in by_version.items()}
            expected = [reference[v][t] for t, v in enumerate(c.versions)]
            torch.testing.assert_close(
                torch.tensor(c.log_probs, dtype=torch.float64),
                torch.tensor(expected, dtype=torch.float64),
                atol=2e-4,
                rtol=0,
            )
            # The other version's log-probs differ: the check can tell the versions apart.
            if len(set(c.versions)) == 2:
                other = [reference[1 - v][t] for t, v in enumerate(c.versions)]
                assert max(abs(a - b) for a, b in zip(c.log_probs, other, strict=True)) > 1e-2
    assert spanning > 0, "no response outlived the first chunk: raise max_tokens or lower the chunk"
    batch = completions_to_batch(groups, pad_token_id=0)
    assert batch["policy_version"].shape == batch["responses"].shape
    assert bool((batch["policy_version"][batch["response_mask"] == 0] == -1).all())


def test_without_chunks_one_call_stamps_its_version(engine, tiny_model):
    engine.load_weights([sorted(load_file(f"{tiny_model}/model.safetensors").items())])
    clock = PolicyClock(5)
    role = Role(engine)
    rollout = VersionedRollout(role, clock)
    (group,) = rollout.generate([[3, 4, 5]], SamplingParams(n=3, max_tokens=6, seed=1))
    assert role.calls == 1
    assert all(c.versions == [5] * len(c.token_ids) for c in group)


def test_a_waiting_sync_goes_before_the_next_generate_call():
    clock, order = PolicyClock(0), []
    with clock.generating():
        # The sync waits for the call in flight; then a new call waits for the sync.
        syncer_ctx = clock.syncing()
        waiting = threading.Event()

        def sync():
            with syncer_ctx:
                order.append("sync")
                clock.advance(1)

        t = threading.Thread(target=lambda: (waiting.set(), sync()))
        t.start()
        waiting.wait()
        while not clock.sync_pending:
            time.sleep(0.001)
        order.append("call 1 ends")

    with clock.generating() as version:
        order.append(f"call 2 at version {version}")
    t.join()
    assert order == ["call 1 ends", "sync", "call 2 at version 1"]
    assert clock.wait_for(1, stop=lambda: False)
    assert not clock.wait_for(2, stop=lambda: True)

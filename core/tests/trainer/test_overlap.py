"""The rollout thread of the overlapping modes: it generates ahead within the staleness bound, hands its
failures to the trainer thread, and the trainer never waits forever."""

from __future__ import annotations

import threading
import time

import pytest
from rlcore.api import Batch
from rlcore.flows.context import StepContext
from rlcore.rollout.partial import PolicyClock
from rlcore.trainer.overlap import Producer, RolloutThreadError


class Collecting:
    """Collects step after step, recording the rollout's version when each began."""

    def __init__(self, clock, fail_at=None, hang_at=None):
        self.clock, self.fail_at, self.hang_at = clock, fail_at, hang_at
        self.versions: dict[int, int] = {}

    def collect(self, ctx, prompts):
        if ctx.step == self.fail_at:
            raise RuntimeError("rollout replica 1 (vllm, plugin rlcore-vllm) died")
        if ctx.step == self.hang_at:
            threading.Event().wait(30)
        self.versions[ctx.step] = self.clock.version
        ctx.sampling_seed()  # a generate call's seed
        return Batch({}, {"prompts": [prompts]}, {})


def context():
    return StepContext(
        config=None,
        preset=None,
        actor=None,
        rollout=None,
        reward=None,
        tokenizer=None,
        pad_token_id=0,
        memory=None,
        transport=None,
        next_prompts=lambda: None,
    )


def producer(algorithm, clock, staleness, last=8, first=1):
    drawn = iter(range(100))
    return Producer(
        algorithm,
        context(),
        clock,
        first=first,
        last=last,
        max_staleness=staleness,
        next_prompts=lambda: next(drawn),
        loader_state=lambda: {"drawn": True},
    )


@pytest.mark.parametrize("staleness", [0, 1, 3])
def test_generation_runs_ahead_by_at_most_the_bound(staleness):
    clock = PolicyClock(0)
    algorithm = Collecting(clock)
    p = producer(algorithm, clock, staleness)
    p.start()
    for step in range(1, 9):
        produced = p.take(step, timeout_s=30, rollout_name="fake")
        assert produced.step == step and produced.batch.objects["prompts"] == [step - 1]
        assert produced.counter == 1 and produced.loader_state == {"drawn": True}
        time.sleep(0.05)  # the update: the rollout thread may run ahead meanwhile
        with clock.syncing():
            clock.advance(step)
    p.stop()
    # Step k trains version k - 1; its batch was generated under version >= k - 1 - staleness ...
    assert all(v >= k - 1 - staleness for k, v in algorithm.versions.items())
    # ... and, given time, right at the bound: generation did run ahead.
    assert any(v == k - 1 - staleness for k, v in algorithm.versions.items() if k > staleness + 1)


def test_a_failure_in_the_rollout_thread_is_raised_in_the_trainers_naming_the_replica():
    clock = PolicyClock(0)
    p = producer(Collecting(clock, fail_at=2), clock, 1)
    p.start()
    p.take(1, timeout_s=30, rollout_name="vllm")
    with pytest.raises(
        RolloutThreadError, match="step 2.*rollout replica 1 \\(vllm, plugin rlcore-vllm\\) died"
    ) as err:
        p.take(2, timeout_s=30, rollout_name="vllm")
    assert isinstance(err.value.__cause__, RuntimeError)
    p.stop()


def test_the_trainer_never_waits_forever():
    clock = PolicyClock(0)
    p = producer(Collecting(clock, hang_at=1), clock, 1)
    p.start()
    with pytest.raises(
        TimeoutError,
        match="no generated batch for step 1 after 1 s: rollout engine 'sglang'.*rollout_wait_timeout_s",
    ):
        p.take(1, timeout_s=1, rollout_name="sglang")
    # A rollout thread that ended (here: told to stop before its last step) is an error at once.
    ended = producer(Collecting(clock), clock, 0, last=3)
    ended.stop(timeout_s=5)  # stopped before it started: it generates nothing
    ended.start()
    ended.join(5)
    with pytest.raises(RolloutThreadError, match="ended without generating step 1"):
        ended.take(1, timeout_s=30, rollout_name="hf")

"""The engine thread's scheduling rules, on a small fake engine that really decodes (no vLLM needed).

The fake produces one token per step per request (``prompt[-1] + k``), like ``LLMEngine`` with
``FINAL_ONLY`` outputs: ``add_request``, ``step`` -> finished outputs, ``abort_request``.
"""

import threading
from concurrent.futures import CancelledError

import attrs
import pytest
from rlcore_vllm.engine_loop import EngineLoop, EngineStopped


@attrs.define
class Output:
    request_id: str
    tokens: list[int]
    finished: bool = True


class FakeEngine:
    def __init__(self):
        self.running: dict[str, tuple[list[int], int]] = {}  # id -> (tokens so far, tokens wanted)
        self.aborted: list[str] = []
        self.steps = 0
        self.step_gate = threading.Event()  # tests hold steps back to observe what is in flight
        self.step_gate.set()
        self.fail_next_step = False

    def add_request(self, request_id, prompt, max_tokens):
        if max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        self.running[request_id] = (list(prompt["prompt_token_ids"]), max_tokens)

    def has_unfinished_requests(self):
        return bool(self.running)

    def abort_request(self, request_ids):
        for rid in request_ids:
            self.running.pop(rid, None)
            self.aborted.append(rid)

    def step(self):
        self.step_gate.wait()
        if self.fail_next_step:
            raise RuntimeError("device lost")
        self.steps += 1
        done = []
        for rid, (tokens, want) in list(self.running.items()):
            tokens.append(tokens[-1] + 1)
            if len(tokens) - 1 >= want:  # the first entry is the prompt's last token
                del self.running[rid]
                done.append(Output(rid, tokens[1:]))
        return done


class FakeLLM:
    def __init__(self):
        self.llm_engine = FakeEngine()


def loop_with(engine_factory=FakeLLM):
    return EngineLoop(engine_factory)


def wait_until_running(engine, count=1):
    """Block until the engine thread has handed ``count`` requests to the engine."""
    for _ in range(1000):
        if len(engine.running) >= count:
            return
        threading.Event().wait(0.01)
    raise AssertionError("the request never reached the engine")


def test_requests_are_decoded_and_batched():
    loop = loop_with()
    try:
        futures = [loop.submit([10 * i], 3) for i in range(1, 4)]
        assert [f.result(timeout=10).tokens for f in futures] == [[11, 12, 13], [21, 22, 23], [31, 32, 33]]
        assert loop.llm.llm_engine.steps >= 3
    finally:
        loop.close()


def test_add_request_error_fails_only_that_request():
    loop = loop_with()
    try:
        bad, good = loop.submit([1], 0), loop.submit([1], 2)
        with pytest.raises(ValueError, match="max_tokens"):
            bad.result(timeout=10)
        assert good.result(timeout=10).tokens == [2, 3]
    finally:
        loop.close()


def test_exclusive_waits_for_earlier_requests_and_holds_later_ones():
    loop = loop_with()
    engine = loop.llm.llm_engine
    try:
        engine.step_gate.clear()
        early = loop.submit([0], 5)
        entered = threading.Event()
        finish = threading.Event()
        seen = {}

        def caller():
            with loop.exclusive() as llm:
                seen["early_done"] = early.done()
                seen["running"] = dict(llm.llm_engine.running)
                entered.set()
                finish.wait()

        thread = threading.Thread(target=caller)
        thread.start()
        assert not entered.wait(0.2), "exclusive must wait while an earlier request runs"
        engine.step_gate.set()
        assert entered.wait(10)
        assert seen == {"early_done": True, "running": {}}
        late = loop.submit([100], 1)
        assert not late.done() and not engine.running, "a request sent meanwhile waits for the block to end"
        finish.set()
        thread.join()
        assert late.result(timeout=10).tokens == [101]
    finally:
        engine.step_gate.set()
        loop.close()


def test_cancel_aborts_the_request():
    loop = loop_with()
    engine = loop.llm.llm_engine
    try:
        engine.step_gate.clear()
        doomed = loop.submit([0], 10**9)
        wait_until_running(engine)
        assert doomed.cancel()
        engine.step_gate.set()
        with pytest.raises(CancelledError):
            doomed.result(timeout=10)
        assert loop.submit([0], 1).result(timeout=10).tokens == [1]
        assert len(engine.aborted) == 1 and not engine.running
    finally:
        engine.step_gate.set()
        loop.close()


def test_failed_step_fails_requests_and_later_calls():
    loop = loop_with()
    engine = loop.llm.llm_engine
    engine.fail_next_step = True
    running = loop.submit([0], 3)
    with pytest.raises(RuntimeError, match="device lost"):
        running.result(timeout=10)
    with pytest.raises(EngineStopped, match="engine thread stopped: RuntimeError: device lost"):
        loop.submit([0], 1)
    with pytest.raises(EngineStopped):
        with loop.exclusive():
            pass


def test_close_fails_what_is_in_flight():
    loop = loop_with()
    engine = loop.llm.llm_engine
    engine.step_gate.clear()
    running = loop.submit([0], 10**9)
    wait_until_running(engine)
    engine.step_gate.set()
    loop.close()
    with pytest.raises(EngineStopped, match="shut down while this request ran"):
        running.result(timeout=10)
    with pytest.raises(EngineStopped, match="shut down"):
        loop.submit([0], 1)


def test_build_error_reaches_the_constructor():
    def broken():
        raise OSError("no such model folder")

    with pytest.raises(OSError, match="no such model folder"):
        EngineLoop(broken)


def test_submit_many_adds_every_request_before_the_next_step():
    """A generate call's requests reach the engine together: all of them are running at the first step
    (one at a time, the thread could step after the first few and prefill the rest behind them)."""

    class CountingEngine(FakeEngine):
        def __init__(self):
            super().__init__()
            self.running_at_first_step = None

        def step(self):
            if self.running_at_first_step is None:
                self.running_at_first_step = len(self.running)
            return super().step()

    class CountingLLM:
        def __init__(self):
            self.llm_engine = CountingEngine()

    loop = loop_with(CountingLLM)
    try:
        futures = loop.submit_many([([i], 2) for i in range(64)])
        assert [f.result(timeout=10).tokens for f in futures] == [[i + 1, i + 2] for i in range(64)]
        assert loop.llm.llm_engine.running_at_first_step == 64
    finally:
        loop.close()


def test_a_seeded_batch_waits_for_requests_in_flight_then_reseeds_first():
    """The reseed must not land while other requests still sample from the generator: the seeded
    batch waits until the engine is idle, reseeds, then adds all its requests before the next step."""
    events = []

    def reseed(llm, seed):
        events.append(("reseed", seed, len(llm.llm_engine.running)))

    loop = EngineLoop(FakeLLM, reseed=reseed)
    engine = loop.llm.llm_engine
    try:
        engine.step_gate.clear()
        running = loop.submit([0], 3)
        wait_until_running(engine)
        batch = loop.submit_many([([10], 2), ([20], 2)], seed=7)
        threading.Event().wait(0.1)
        assert events == [] and len(engine.running) == 1  # held back while the first request runs
        engine.step_gate.set()
        assert running.result(timeout=10).tokens == [1, 2, 3]
        assert [f.result(timeout=10).tokens for f in batch] == [[11, 12], [21, 22]]
        assert events == [("reseed", 7, 0)]
    finally:
        loop.close()


def test_a_failing_reseed_fails_its_batch_and_keeps_the_loop():
    def reseed(llm, seed):
        raise RuntimeError("no generator")

    loop = EngineLoop(FakeLLM, reseed=reseed)
    try:
        (doomed,) = loop.submit_many([([1], 2)], seed=1)
        with pytest.raises(RuntimeError, match="no generator"):
            doomed.result(timeout=10)
        assert loop.submit([5], 1).result(timeout=10).tokens == [6]
    finally:
        loop.close()

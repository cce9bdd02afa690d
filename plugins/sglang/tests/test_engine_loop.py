"""The engine loop: a thread's running event loop owns the engine; requests pass a gate that exclusive
use (weight loads, memory releases) closes. Exercised with real coroutines standing in for SGLang's
(``asyncio.sleep`` where SGLang would decode); the loop and gate are the code under test."""

import asyncio
import threading
import time

import pytest
from rlcore_sglang.engine_loop import EngineLoop, EngineStopped


class Engine:
    """Built on the loop thread, as sglang.Engine is; records what ran when."""

    def __init__(self):
        self.loop = asyncio.get_running_loop()  # sglang.Engine adopts the running loop the same way
        self.thread = threading.current_thread()
        self.events: list[str] = []

    async def request(self, name: str, seconds: float) -> str:
        self.events.append(f"start {name}")
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            self.events.append(f"cancelled {name}")
            raise
        self.events.append(f"end {name}")
        return name


@pytest.fixture
def loop():
    engine_loop = EngineLoop(Engine)
    yield engine_loop
    engine_loop.close()


def test_the_engine_is_built_on_the_running_loop_of_its_thread(loop):
    assert loop.engine.thread is not threading.current_thread()
    assert loop.run(lambda: _current_loop()) is loop.engine.loop


async def _current_loop():
    return asyncio.get_running_loop()


def test_requests_run_concurrently_and_from_fresh_event_loops(loop):
    async def many():
        futures = [loop.submit(lambda i=i: loop.engine.request(f"r{i}", 0.2)) for i in range(8)]
        return await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))

    for _ in range(2):  # the second asyncio.run is a new caller loop
        assert asyncio.run(many()) == [f"r{i}" for i in range(8)]
        # Concurrent: all 8 started before any ended (counted from the events, not timed: a loaded
        # machine may run slowly, never serially).
        events = loop.engine.events
        assert [e.split()[0] for e in events[:8]] == ["start"] * 8, events
        events.clear()
    assert loop.in_flight == 0


def test_exclusive_waits_for_admitted_requests_and_holds_new_ones(loop):
    engine = loop.engine
    early = loop.submit(lambda: engine.request("early", 0.3))
    time.sleep(0.05)
    with loop.exclusive():
        assert early.done(), "exclusive must wait for requests admitted before it"
        late = loop.submit(lambda: engine.request("late", 0.0))
        time.sleep(0.2)
        assert not late.done(), "a request submitted inside exclusive must wait for the block to exit"
        engine.events.append("exclusive")
        assert loop.run(lambda: engine.request("inside", 0.0)) == "inside"  # run() passes the gate
    assert late.result(timeout=5) == "late"
    assert engine.events == [
        "start early",
        "end early",
        "exclusive",
        "start inside",
        "end inside",
        "start late",
        "end late",
    ]


def test_cancelling_a_request_cancels_its_coroutine(loop):
    engine = loop.engine
    future = loop.submit(lambda: engine.request("slow", 30))
    time.sleep(0.1)
    future.cancel()
    deadline = time.time() + 5
    while "cancelled slow" not in engine.events and time.time() < deadline:
        time.sleep(0.01)
    assert engine.events == ["start slow", "cancelled slow"]
    with loop.exclusive():  # the gate was left: exclusive does not wait for the cancelled request
        pass


def test_a_failing_request_raises_in_the_caller_and_leaves_the_loop_usable(loop):
    async def boom():
        raise ValueError("bad request")

    with pytest.raises(ValueError, match="bad request"):
        loop.submit(boom).result(timeout=5)
    assert loop.submit(lambda: loop.engine.request("after", 0)).result(timeout=5) == "after"


def test_build_errors_reach_the_caller_and_stop_the_thread():
    threads = threading.active_count()

    def build():
        raise RuntimeError("no GPU")

    with pytest.raises(RuntimeError, match="no GPU"):
        EngineLoop(build)
    assert threading.active_count() == threads


def test_close_cancels_what_runs_and_refuses_new_work():
    loop = EngineLoop(Engine)
    running = loop.submit(lambda: loop.engine.request("long", 30))
    time.sleep(0.05)
    loop.close()
    assert running.cancelled() and "cancelled long" in loop.engine.events
    with pytest.raises(EngineStopped, match="shut down"):
        loop.submit(lambda: loop.engine.request("x", 0))
    loop.close()  # idempotent

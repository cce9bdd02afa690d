"""A thread running the asyncio event loop that owns one ``sglang.Engine`` (pure asyncio: no sglang).

Why a thread: SGLang's engine answers requests through an event loop of its own (its tokenizer
manager's receive task runs on whichever loop first sent a request, and every synchronous ``Engine``
method is ``loop.run_until_complete`` on that loop). ``agenerate`` callers await requests on *their*
loop, often a fresh ``asyncio.run`` each time, while ``generate`` comes from plain threads. So the engine
is built, and every call into it made, on one loop that runs forever on this thread; callers hand it
coroutines (:meth:`EngineLoop.submit`, :meth:`EngineLoop.run`) and wait on concurrent futures.

Requests pass a gate. :meth:`EngineLoop.exclusive` closes it once the requests already admitted have
finished, and holds new ones back until the block exits: a weight load of several buckets, or a
memory release (which SGLang allows only when its scheduler is idle), never overlaps a request, so no
request sees half-loaded weights.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")


class EngineStopped(RuntimeError):
    """The engine loop is gone (shut down); build a new engine."""


class _Gate:
    """Counts requests in flight and closes for exclusive use. Lives on the loop (asyncio, one thread)."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.closed = False
        self.changed = asyncio.Condition()

    async def enter(self) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: not self.closed)
            self.in_flight += 1

    async def leave(self) -> None:
        async with self.changed:
            self.in_flight -= 1
            self.changed.notify_all()

    async def close(self) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: not self.closed)  # one exclusive holder at a time
            self.closed = True
            await self.changed.wait_for(lambda: self.in_flight == 0)

    async def open(self) -> None:
        async with self.changed:
            self.closed = False
            self.changed.notify_all()


class EngineLoop:
    """Runs ``build()`` on a new thread's running event loop, then keeps that loop running for the
    engine ``build`` returned (``self.engine``)."""

    def __init__(self, build: Callable[[], Any], name: str = "rlcore-sglang-engine"):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._closed = False
        self._gate: _Gate = self.run(_make_gate)
        try:
            # Built inside a coroutine, so that the engine finds this loop running and adopts it.
            self.engine = self.run(_call_async(build))
        except BaseException:
            self.close()
            raise

    # -- caller side -----------------------------------------------------------------------------
    def submit(self, make: Callable[[], Awaitable[T]]) -> Future:
        """Schedule the coroutine ``make()`` as a request: it waits at the gate, then runs on the loop.
        Cancelling the returned future cancels the coroutine (wherever it is awaiting)."""
        self._check_alive()
        return asyncio.run_coroutine_threadsafe(self._request(make), self._loop)

    def run(self, make: Callable[[], Awaitable[T]], timeout: float | None = None) -> T:
        """Run ``make()`` on the loop now, past the gate, and wait for its result (for calls made inside
        :meth:`exclusive`, and for setup)."""
        self._check_alive()
        if threading.current_thread() is self._thread:
            raise RuntimeError("EngineLoop.run called from the engine loop itself (it would deadlock)")
        return asyncio.run_coroutine_threadsafe(_await(make), self._loop).result(timeout)

    @contextmanager
    def exclusive(self) -> Iterator[Any]:
        """Wait until the requests admitted so far have finished, hold new ones back, and yield the
        engine; use :meth:`run` for calls into it inside the block."""
        self.run(lambda: self._gate.close())
        try:
            yield self.engine
        finally:
            if not self._closed:
                self.run(lambda: self._gate.open())

    def close(self) -> None:
        """Cancel what is in flight and stop the loop's thread (the engine itself is its owner's to
        shut down). Idempotent."""
        if self._closed:
            return
        self._closed = True

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(cancel_all(), self._loop).result()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop.close()

    @property
    def in_flight(self) -> int:
        """Requests admitted past the gate and not yet finished."""
        return self._gate.in_flight

    def _check_alive(self) -> None:
        if self._closed or not self._thread.is_alive():
            raise EngineStopped("the SGLang engine was shut down; build a new one")

    # -- loop side -------------------------------------------------------------------------------
    async def _request(self, make: Callable[[], Awaitable[T]]) -> T:
        await self._gate.enter()
        try:
            return await make()
        finally:
            await self._gate.leave()


async def _make_gate() -> _Gate:
    return _Gate()


async def _await(make: Callable[[], Awaitable[T]]) -> T:
    return await make()


def _call_async(build: Callable[[], T]) -> Callable[[], Awaitable[T]]:
    async def call() -> T:
        return build()

    return call

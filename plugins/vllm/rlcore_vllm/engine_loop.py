"""A dedicated thread that owns one vLLM engine and steps it.

Why a thread: ``agenerate`` callers (multi-turn and agent loops) keep many requests in flight and await
them; something must call ``LLMEngine.step()`` while their event loop runs other work. Synchronous
``generate`` goes through the same queue, so every request is scheduled alike and batched with whatever
else is in flight. Everything else that touches the engine (weight loads, cache resets, sleep) runs in
the *caller's* thread inside :meth:`EngineLoop.exclusive`, while this thread is parked: the weight
stream is then read where the trainer produced it (its device, its process group), and no request sees
half-loaded weights.

The engine is built on this thread too, so the thread that steps it is the one vLLM initialised (device
binding on accelerators, memory binding on CPU).
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, InvalidStateError
from contextlib import contextmanager
from typing import Any

import attrs

log = logging.getLogger(__name__)


class EngineStopped(RuntimeError):
    """The engine thread is gone (shut down, or an engine step failed); build a new engine."""


@attrs.define
class _Submit:
    request_id: str
    prompt: list[int] | dict  # token ids, or a vLLM prompt dict (``multi_modal_data`` with them)
    params: Any  # vllm.SamplingParams
    future: Future


@attrs.define
class _Seeded:
    """Requests added together once the engine is idle, right after ``reseed(llm, seed)``."""

    seed: int
    submits: list[_Submit]


@attrs.define
class _Abort:
    request_id: str


@attrs.define
class _Park:
    parked: threading.Event = attrs.field(factory=threading.Event)
    resume: threading.Event = attrs.field(factory=threading.Event)


class _Stop:
    pass


class EngineLoop:
    """Runs ``build()`` (returning a ``vllm.LLM``) on a new thread, then steps that engine whenever it has
    requests. ``llm`` is the engine; touch it only inside :meth:`exclusive`."""

    def __init__(
        self,
        build: Callable[[], Any],
        name: str = "rlcore-vllm-engine",
        reseed: Callable[[Any, int], None] | None = None,
    ):
        self._reseed = reseed
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._futures: dict[str, Future] = {}
        self._failure: BaseException | None = None
        self._ids = itertools.count()
        self._backlog: collections.deque = collections.deque()  # commands taken from the inbox, in order
        #: ``LoRARequest`` every request added from now on generates with (None: the base model); set
        #: while the thread is parked (:meth:`exclusive`), so requests in flight keep the one they began with.
        self.lora_request: Any = None
        started: Future = Future()
        self._thread = threading.Thread(target=self._run, args=(build, started), name=name, daemon=True)
        self._thread.start()
        self.llm = started.result()  # re-raises what build() raised

    # -- caller side -----------------------------------------------------------------------------
    def submit(self, prompt: list[int], params: Any) -> Future:
        """Queue one single-sample request; the future resolves to its final ``RequestOutput``.
        Cancelling the future aborts the request in the engine."""
        return self.submit_many([(prompt, params)])[0]

    def submit_many(self, requests: Sequence[tuple[list[int], Any]], seed: int | None = None) -> list[Future]:
        """Queue ``(prompt, params)`` requests as one command: the engine thread adds them all before its
        next step. Queued one by one, the thread could start stepping after the first few and schedule
        the rest's prefills step by step behind them (the batch-256 gap to raw ``LLM.generate``).

        With ``seed``, the thread waits until nothing else is in flight, reseeds the engine's sampling
        generator (``reseed``) and then adds the batch: the same batch and seed sample the same tokens,
        without a generator per request (vLLM samples requests with their own generator one by one)."""
        self._check_alive()
        commands, futures = [], []
        for prompt, params in requests:
            request_id = f"rlcore-{next(self._ids)}"
            future: Future = Future()
            future.add_done_callback(functools.partial(self._abort_if_cancelled, request_id))
            commands.append(_Submit(request_id, prompt, params, future))
            futures.append(future)
        if seed is None:
            self._inbox.put(commands)
        else:
            if self._reseed is None:
                raise ValueError("this engine loop was built without a reseed function")
            self._inbox.put(_Seeded(seed, commands))
        return futures

    def _abort_if_cancelled(self, request_id: str, future: Future) -> None:
        if future.cancelled():
            self._inbox.put(_Abort(request_id))

    @contextmanager
    def exclusive(self) -> Iterator[Any]:
        """Park the engine thread once the requests queued before this call have finished, and yield the
        engine to the caller's thread; requests queued meanwhile wait until the block exits."""
        self._check_alive()
        park = _Park()
        self._inbox.put(park)
        try:
            while not park.parked.wait(0.05):
                self._check_alive()
            yield self.llm
        finally:
            park.resume.set()

    def close(self) -> None:
        """Abort what is in flight and stop the thread (the engine itself stays for its owner to shut)."""
        if self._thread.is_alive():
            self._inbox.put(_Stop())
            self._thread.join()

    def _check_alive(self) -> None:
        if self._failure is not None:
            raise EngineStopped(
                f"the vLLM engine thread stopped: {type(self._failure).__name__}: {self._failure}"
            ) from self._failure
        if not self._thread.is_alive():
            raise EngineStopped("the vLLM engine was shut down; build a new one")

    # -- engine thread ---------------------------------------------------------------------------
    def _run(self, build: Callable[[], Any], started: Future) -> None:
        try:
            llm = build()
        except BaseException as exc:
            started.set_exception(exc)
            return
        started.set_result(llm)
        engine, backlog = llm.llm_engine, self._backlog
        try:
            while True:
                if not backlog and not engine.has_unfinished_requests():
                    backlog.append(self._inbox.get())  # idle: sleep until there is something to do
                while True:
                    try:
                        backlog.append(self._inbox.get_nowait())
                    except queue.Empty:
                        break
                if not self._handle(engine, backlog):
                    return
                if engine.has_unfinished_requests():
                    for output in engine.step():
                        if output.finished:
                            _resolve(self._futures.pop(output.request_id, None), output)
        except BaseException as exc:
            log.exception("vLLM engine step failed; failing every request in flight")
            self._failure = exc
            self._fail_all(exc)

    def _handle(self, engine: Any, backlog: collections.deque) -> bool:
        """Apply queued commands in order; a park waits (and holds back what follows it) while requests
        are in flight. Returns False on stop."""
        while backlog:
            command = backlog[0]
            if isinstance(command, (_Park, _Seeded)) and engine.has_unfinished_requests():
                return True
            backlog.popleft()
            if isinstance(command, list):  # submit_many: add every request before the next step
                for submit in command:
                    self._add(engine, submit)
            elif isinstance(command, _Seeded):
                try:
                    self._reseed(self.llm, command.seed)
                except Exception as exc:
                    for submit in command.submits:
                        _resolve(submit.future, exc)
                    continue
                for submit in command.submits:
                    self._add(engine, submit)
            elif isinstance(command, _Abort):
                if self._futures.pop(command.request_id, None) is not None:
                    engine.abort_request([command.request_id])
            elif isinstance(command, _Park):
                command.parked.set()
                command.resume.wait()
            else:  # _Stop
                if self._futures:
                    engine.abort_request(list(self._futures))
                self._fail_all(EngineStopped("the vLLM engine was shut down while this request ran"))
                return False
        return True

    def _add(self, engine: Any, command: _Submit) -> None:
        if command.future.cancelled():
            return
        try:
            # The adapter only when there is one: engines (and test doubles) without LoRA keep their call.
            lora = {"lora_request": self.lora_request} if self.lora_request is not None else {}
            prompt = (
                command.prompt if isinstance(command.prompt, dict) else {"prompt_token_ids": command.prompt}
            )
            engine.add_request(command.request_id, prompt, command.params, **lora)
        except Exception as exc:
            _resolve(command.future, exc)
        else:
            self._futures[command.request_id] = command.future

    def _fail_all(self, exc: BaseException) -> None:
        for future in self._futures.values():
            _resolve(future, exc)
        self._futures.clear()
        while True:  # settle requests this thread will never handle (parked callers poll _check_alive)
            try:
                self._backlog.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        for command in self._backlog:
            submits = command.submits if isinstance(command, _Seeded) else command
            for submit in submits if isinstance(submits, list) else [submits]:
                if isinstance(submit, _Submit):
                    _resolve(submit.future, exc)
        self._backlog.clear()


def _resolve(future: Future | None, value: Any) -> None:
    """Settle ``future`` with a result or an exception, unless its caller cancelled it meanwhile."""
    if future is None:
        return
    try:
        if not future.set_running_or_notify_cancel():
            return
        if isinstance(value, BaseException):
            future.set_exception(value)
        else:
            future.set_result(value)
    except (InvalidStateError, RuntimeError):
        pass  # already settled

"""The overlapping training modes (``trainer.mode: one_step_off | async``): generation runs ahead of
training on a second driver thread, within a staleness bound.

The driver keeps one control flow per thread. The **rollout thread** (:class:`Producer`) runs the
algorithm's ``collect`` (generate, score) for step after step into a queue; the **trainer thread** (the
caller of :meth:`Producer.take`) runs ``learn`` on each batch in step order, syncs the weights and
advances the :class:`~rlcore.rollout.partial.PolicyClock`. The roles are Ray actors, so while the actor
trains on step ``k``'s batch the rollout generates step ``k + 1``'s on its own devices.

The staleness bound: step ``k`` trains the weights of version ``k - 1`` (one sync per step), so its
samples may be drawn under version ``k - 1 - S`` at the oldest (``S``:
:func:`rlcore.config.specs.max_staleness`). The rollout thread starts generating step ``k`` only once
the rollout holds that version, and waits otherwise. With a partial rollout a response that started
under that version may finish under a later one; its oldest token still bounds its staleness. With
``S = 0`` the rollout thread generates each batch after the previous update's sync, from the same seeds,
so the run is the synchronous one.

``trainer.schedule: free`` lets the rollout run as far ahead as the bound allows, so which version a
batch is sampled under depends on the threads' speeds. ``lockstep`` pins it: the trainer's sync to version
``v + 1`` waits until step ``v + 1 + S``'s batch is generated, so step ``k`` is always sampled under version
``k - 1 - S`` exactly, and the same command trains the same samples twice (generation of step ``k + S``
still overlaps step ``k``'s update).

Prompts are drawn in step order by the rollout thread alone, and each produced batch carries the prompt
loader's state after its prompts: a checkpoint saves the state of the last *trained* batch, so a resumed
run regenerates the batches that were generated but not trained, and no prompt is trained twice or lost.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs

from rlcore.api import Batch
from rlcore.rollout.partial import PolicyClock


@attrs.define(eq=False)
class Produced:
    """One step's generated and scored batch."""

    step: int
    batch: Batch
    #: the collect's metrics and ``timing/*`` (generate, score ...)
    metrics: dict[str, float]
    #: seeds and group ids the collect drew (the learn half continues from there)
    counter: int
    #: the prompt loader's state after this step's prompts
    loader_state: dict[str, Any]
    #: the rollout's policy version when the collect started
    version: int


class RolloutThreadError(RuntimeError):
    """The rollout thread failed; the original error is the ``__cause__``."""


class Producer(threading.Thread):
    """Runs ``algorithm.collect`` for steps ``first .. last`` within the staleness bound (module docstring).

    ``ctx``: the rollout thread's own :class:`~rlcore.flows.context.StepContext` (``StepContext.fork``);
    ``next_prompts()`` draws a step's prompts, ``loader_state()`` says where the prompt loader stands.
    """

    def __init__(
        self,
        algorithm: Any,
        ctx: Any,
        clock: PolicyClock,
        *,
        first: int,
        last: int,
        max_staleness: int,
        next_prompts: Callable[[], Batch],
        loader_state: Callable[[], dict[str, Any]],
    ):
        super().__init__(name="rlcore-rollout", daemon=True)
        self.algorithm, self.ctx, self.clock = algorithm, ctx, clock
        self.first, self.last, self.max_staleness = first, last, max_staleness
        self.next_prompts, self.loader_state = next_prompts, loader_state
        self._queue: queue.Queue[Produced | BaseException] = queue.Queue()
        self._stopping = threading.Event()
        #: the last step whose batch is generated (the lockstep schedule's trainer waits on it)
        self.produced = first - 1
        self._produced_changed = threading.Condition()

    def run(self) -> None:
        try:
            for step in range(self.first, self.last + 1):
                if self._stopping.is_set():
                    return
                if not self.clock.wait_for(step - 1 - self.max_staleness, self._stopping.is_set):
                    return
                ctx = self.ctx
                ctx.begin_step(step)
                ctx.version = self.clock.version
                start = time.perf_counter()
                batch = self.algorithm.collect(ctx, self.next_prompts())
                metrics = {
                    **ctx.metrics,
                    **ctx.timer.metrics(),
                    "timing/collect": time.perf_counter() - start,
                }
                state = self.loader_state()
                self._queue.put(Produced(step, batch, metrics, ctx.counter, state, ctx.version))
                with self._produced_changed:
                    self.produced = step
                    self._produced_changed.notify_all()
        except BaseException as exc:  # handed to the trainer thread, which raises it
            self._queue.put(exc)
        finally:
            with self._produced_changed:  # a waiting trainer sees the end (and then the error, if any)
                self._produced_changed.notify_all()

    def wait_produced(self, step: int, timeout_s: float) -> None:
        """Block until step ``step``'s batch is generated (``trainer.schedule: lockstep``: the trainer's
        sync to the version after step ``step - S`` waits for it, so that batch is sampled under exactly
        version ``step - 1 - S``, whatever the two threads' speeds). Returns early if the thread ended; the
        trainer's next :meth:`take` raises its error."""
        deadline = time.monotonic() + timeout_s
        with self._produced_changed:
            while self.produced < step and self.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"lockstep schedule: step {step}'s batch was not generated after {timeout_s:.0f} s; "
                        "if the rollout is only slow, raise trainer.rollout_wait_timeout_s"
                    )
                self._produced_changed.wait(min(left, 0.5))

    def take(self, step: int, timeout_s: float, rollout_name: str) -> Produced:
        """Step ``step``'s batch, waiting for it; the rollout thread's error is raised here. A thread that
        died, or no batch in ``timeout_s`` seconds, is an error naming the rollout, never an endless wait."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                item = self._queue.get(timeout=0.5)
            except queue.Empty:
                if not self.is_alive() and self._queue.empty():
                    raise RolloutThreadError(
                        f"the rollout thread ended without generating step {step}'s batch "
                        f"(rollout engine {rollout_name!r})"
                    ) from None
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"no generated batch for step {step} after {timeout_s:.0f} s: rollout engine "
                        f"{rollout_name!r} is generating (the rollout thread is alive) but has not finished; "
                        "if it is only slow, raise trainer.rollout_wait_timeout_s"
                    ) from None
                continue
            if isinstance(item, BaseException):
                raise RolloutThreadError(
                    f"generating step {step}'s batch failed in the rollout thread: {item}"
                ) from item
            if item.step != step:
                raise RuntimeError(f"the rollout thread produced step {item.step} where step {step} was due")
            return item

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop after the generate call in flight (if any) and wait for the thread."""
        self._stopping.set()
        if self.ident is not None:  # started
            self.join(timeout_s)

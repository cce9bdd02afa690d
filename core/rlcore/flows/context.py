"""What an algorithm's step sees: :class:`StepContext`, and the colocation memory plan.

The :class:`~rlcore.trainer.loop.Trainer` builds one context per run and hands it to
``Algorithm.step(ctx, prompts)`` every step. It carries the role handles, the reward provider, the
resolved algorithm preset, the KL controller, and the small services every phase needs: phase timing,
step metrics, deterministic sampling seeds and group ids, and :class:`MemoryPlan`, which releases and
resumes device memory by tag around each phase when roles share devices.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from rlcore.api import Batch, SamplingParams
from rlcore.api.requests import derived_seed
from rlcore.telemetry.metrics import PhaseTimer

#: What each train role moves off the device while the rollout generates (the reference model and the
#: distillation teacher have no optimizer or gradients).
TRAIN_TAGS = {"actor": ("weights", "grads", "optimizer"), "critic": ("weights", "grads", "optimizer")}
REFERENCE_TAGS = ("weights",)
#: Roles that only run forward passes, holding weights alone.
FROZEN_ROLES = ("reference", "teacher")
ROLLOUT_TAGS = ("weights", "kv_cache")


class MemoryPlan:
    """Colocated placement: which role holds device memory in which phase.

    States (the rollout's tags / the train roles' tags that are *released*):

    ==============  =========================  ==============================================
    state           rollout released           train roles released
    ==============  =========================  ==============================================
    ``generate``    nothing                    all their tags when ``release_train`` else none
    ``train``       ``weights``, ``kv_cache``  none
    ``sync``        ``kv_cache`` if it was     actor none; others as in ``generate``
                    released (never released
                    alone)
    ``check``       nothing                    actor ``grads``/``optimizer`` (with
                                               ``release_train``); others as in ``generate``
    ==============  =========================  ==============================================

    Only transitions issue calls: releases first (freeing memory), then resumes. When the rollout
    takes memory back, every train role that kept its state first hands its allocator's cached, unused
    blocks back to the device (``empty_cache``): without it, the peak of the last update or reference
    pass stays reserved in those processes while the rollout's KV cache asks for its share. With
    ``enabled`` false (split placement: the rollout has devices of its own; or devices that are the
    host's memory) every state is a no-op.
    """

    def __init__(self, enabled: bool, rollout: Any, train_roles: dict[str, Any], release_train: bool = False):
        self.enabled, self.rollout, self.train_roles = enabled, rollout, dict(train_roles)
        self.release_train = release_train
        self.released: dict[str, set[str]] = {name: set() for name in [*self.train_roles, "rollout"]}
        #: seconds spent in release/resume calls, reported per step as ``timing/release_resume``
        self.seconds = 0.0
        self.state: str | None = None

    def _tags(self, role: str) -> tuple[str, ...]:
        return REFERENCE_TAGS if role in FROZEN_ROLES else TRAIN_TAGS.get(role, TRAIN_TAGS["actor"])

    def _idle_train(self) -> dict[str, set[str]]:
        return {r: set(self._tags(r)) if self.release_train else set() for r in self.train_roles}

    def use(self, state: str) -> None:
        """Move to ``state`` (see the class docstring)."""
        if not self.enabled or state == self.state:
            return
        if state == "generate":
            want = {**self._idle_train(), "rollout": set()}
        elif state == "train":
            want = {**{r: set() for r in self.train_roles}, "rollout": set(ROLLOUT_TAGS)}
        elif state == "sync":
            # The rollout needs its weights, not its cache. Its tags are never released one by one:
            # vLLM's sleep frees weights and KV cache together, whichever tag is named.
            want = {**self._idle_train(), "actor": set(), "rollout": self.released["rollout"] & {"kv_cache"}}
        elif state == "check":
            actor = {"grads", "optimizer"} if self.release_train else set()
            want = {**self._idle_train(), "actor": actor, "rollout": set()}
        else:
            raise ValueError(f"unknown memory state {state!r}; use generate, train, sync or check")
        handles = {**self.train_roles, "rollout": self.rollout}
        start = time.perf_counter()
        released_now = set()
        for name, tags in want.items():
            extra = sorted(tags - self.released[name])
            if extra:
                handles[name].release(extra)  # a release empties that role's cache too
                self.released[name] |= set(extra)
                released_now.add(name)
        if self.released["rollout"] - want["rollout"]:
            for name in self.train_roles:
                resident = set(self._tags(name)) - self.released[name]
                if name not in released_now and resident:
                    handles[name].empty_cache()
        for name, tags in want.items():
            back = sorted(self.released[name] - tags)
            if back:
                handles[name].resume(back)
                self.released[name] -= set(back)
        self.state = state
        self.seconds += time.perf_counter() - start

    def take_seconds(self) -> float:
        """Seconds spent releasing and resuming since the last call (part of the phases' own times)."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds


@attrs.define(eq=False)
class StepContext:
    """The controller's view of the run, as an algorithm's step uses it.

    Roles: ``actor``, ``rollout`` always; ``critic``, ``reference`` when the preset needs them, ``teacher``
    when the algorithm distils (else ``None``). ``reward`` scores batches; ``preset`` is the resolved
    :class:`~rlcore.algorithms.presets.AlgorithmPreset` (preset values with the user's overrides);
    ``kl_ctrl`` the in-reward KL coefficient controller (``None`` without a KL penalty in the reward);
    ``next_prompts()`` draws the next training batch of prompts (dynamic sampling refills from it).
    """

    config: Any
    preset: Any
    actor: Any
    rollout: Any
    reward: Any
    tokenizer: Any
    pad_token_id: int
    memory: MemoryPlan
    transport: Any
    next_prompts: Callable[[], Batch]
    critic: Any = None
    reference: Any = None
    #: the distillation teacher (:mod:`rlcore.flows.opd`): log-probs of the student's sampled tokens
    teacher: Any = None
    kl_ctrl: Any = None
    #: token ids of the prompts the post-sync check generates from
    probe_prompts: list[list[int]] = attrs.Factory(list)
    #: their images (``multi_modal_data`` of the data rows, :mod:`rlcore.vision`), or None for text
    #: probes: with a vision model the check covers the vision tower too
    probe_media: list | None = None
    #: the post-sync check's floor, measured at this process's first check (the initial sync)
    sync_floor: Any = None
    seed: int = 0
    step: int = 0
    timer: PhaseTimer = attrs.Factory(PhaseTimer)
    metrics: dict[str, float] = attrs.Factory(dict)
    #: the policy version the actor's weights are at (weight syncs so far); samples whose
    #: ``policy_version`` is older are stale (:func:`rlcore.flows.phases.correct_off_policy`)
    version: int = 0
    #: where each phase is recorded as an interval (:class:`rlcore.telemetry.timeline.Timeline`)
    timeline: Any = None
    #: what this step's actor update trained on (:func:`rlcore.telemetry.samples.trained_rows`)
    trained: dict[str, list] | None = None
    _counter: int = 0

    # -- per step --------------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """Reset timings, metrics and the seed/uid counters for step ``step``."""
        self.step, self.timer, self.metrics, self._counter = step, PhaseTimer(), {}, 0
        self.trained = None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """``with ctx.phase("generate"):`` times the block as ``timing/generate`` (and records it on the
        timeline)."""
        start = time.perf_counter()
        with self.timer(name):
            yield
        if self.timeline is not None:
            self.timeline.record(name, start, time.perf_counter(), self.step, self.version)

    def record(self, metrics: dict[str, float]) -> None:
        """Add metrics to this step's record."""
        self.metrics.update({k: float(v) for k, v in metrics.items()})

    @contextlib.contextmanager
    def detached(self) -> Iterator[dict[str, float]]:
        """Run phases (validation) whose metrics and timings must not mix with the step's: yields the
        dict they record into; the step's own record is restored afterwards."""
        saved = self.timer, self.metrics
        self.timer, self.metrics = PhaseTimer(), {}
        try:
            yield self.metrics
        finally:
            self.timer, self.metrics = saved

    def fork(self, **changes: Any) -> StepContext:
        """A context over the same roles with its own step, timings, metrics and counters: the one the
        generating thread of an overlapping run steps through."""
        return attrs.evolve(self, timer=PhaseTimer(), metrics={}, **changes)

    @property
    def counter(self) -> int:
        """Seeds and group ids drawn this step (a step continued in another context resumes from it)."""
        return self._counter

    def continue_step(self, step: int, counter: int) -> None:
        """:meth:`begin_step`, then draw seeds after the ``counter`` another context drew for this step
        (its generation): the step's seeds are then those of a step run in one context."""
        self.begin_step(step)
        self._counter = counter

    def _next(self) -> int:
        self._counter += 1
        return self._counter

    def sampling_seed(self, stream: int = 0) -> int:
        """A seed for the next generate call: a function of ``(trainer seed, step, stream, call number)``
        only, so a resumed run samples what the uninterrupted one would have."""
        entropy = [self.seed, self.step, stream, self._next()]
        return derived_seed(*entropy)

    def new_uids(self, count: int) -> list[str]:
        """Group ids for ``count`` new prompts, unique within the run (``"<step>.<k>"``)."""
        return [f"{self.step}.{self._next()}" for _ in range(count)]

    def sampling_params(
        self,
        *,
        n: int | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        stream: int = 0,
    ) -> SamplingParams:
        """The rollout section's sampling settings, with a fresh seed; arguments override."""
        r = self.config.rollout
        return SamplingParams(
            n=r.n if n is None else n,
            temperature=r.temperature if temperature is None else temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            max_tokens=r.max_response_length if max_tokens is None else max_tokens,
            stop=tuple(r.stop),
            logprobs=True,
            seed=self.sampling_seed(stream),
        )

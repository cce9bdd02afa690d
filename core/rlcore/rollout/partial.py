"""Generation that knows which weights sampled each token, for the overlapping training modes.

:class:`PolicyClock` is the policy version the rollout's weights are at (the count of weight syncs; 0:
the first sync, before step 1), shared by the thread that generates and the one that trains. Whoever
uses or changes the rollout's weights holds it: a generate call (:meth:`PolicyClock.generating`) or a
weight sync (:meth:`PolicyClock.syncing`, which goes first when both wait). So a version read under it
is the version of every token that call samples.

:class:`VersionedRollout` wraps a rollout role: every completion comes back with
``Completion.versions`` stamped. With ``chunk_tokens`` set it generates a partial rollout: each call
samples at most ``chunk_tokens`` tokens per response, and the responses that neither stopped nor used
their budget are sent again, prompt plus their tokens so far, in the next call. A weight sync waiting
for the clock lands between two calls, so a response continues under the new weights, and its tokens
carry both versions; its log-probs are each under the weights that sampled the token (the engine
scores a continuation under the weights it holds). The engine's prefix cache is invalidated by the
new weights (``RolloutEngine.load_weights``), so a continued response's prefix is recomputed under them
(what pausing and resuming requests in the engine would have to do as well).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs

from rlcore.api import Completion, SamplingParams
from rlcore.api.requests import derived_seed


class PolicyClock:
    """The rollout's policy version, the lock over its weights, and the wait for a version."""

    def __init__(self, version: int = 0):
        self.version = version
        self._lock = threading.Lock()
        self._changed = threading.Condition()
        self._syncs_waiting = 0
        self._sync_owner: int | None = None

    @contextlib.contextmanager
    def generating(self) -> Iterator[int]:
        """Hold the rollout for one generate call; yields the version its tokens are sampled under. A
        weight sync that is waiting goes first."""
        if self._sync_owner == threading.get_ident():
            yield self.version  # the sync's own post-sync check generates under the weights it loaded
            return
        with self._changed:
            self._changed.wait_for(lambda: self._syncs_waiting == 0)
        with self._lock:
            yield self.version

    @contextlib.contextmanager
    def syncing(self) -> Iterator[None]:
        """Hold the rollout for a weight sync (and the post-sync check, whose generate calls from this
        thread go through); callers then :meth:`advance`."""
        with self._changed:
            self._syncs_waiting += 1
        try:
            with self._lock:
                self._sync_owner = threading.get_ident()
                try:
                    yield
                finally:
                    self._sync_owner = None
        finally:
            with self._changed:
                self._syncs_waiting -= 1
                self._changed.notify_all()

    @property
    def sync_pending(self) -> bool:
        """Whether a weight sync is waiting for (or holding) the rollout."""
        with self._changed:
            return self._syncs_waiting > 0

    def advance(self, version: int) -> None:
        """The rollout now holds the weights of ``version``."""
        with self._changed:
            self.version = version
            self._changed.notify_all()

    def wait_for(self, version: int, stop: Callable[[], bool], poll_s: float = 0.5) -> bool:
        """Block until the rollout holds ``version`` or later; ``False`` when ``stop()`` said to give up."""
        with self._changed:
            while self.version < version:
                if stop():
                    return False
                self._changed.wait(poll_s)
        return True


@attrs.define(eq=False)
class PartialResponse:
    """A response generated across calls (a partial rollout, or :mod:`rlcore.stream`'s rounds), each
    token stamped with the policy version that sampled it."""

    prompt: list[int]
    tokens: list[int] = attrs.Factory(list)
    log_probs: list[float] | None = attrs.Factory(list)
    versions: list[int] = attrs.Factory(list)
    finish_reason: str = "length"
    text: str = ""
    done: bool = False
    #: generate calls it took (more than one: it was continued, perhaps under newer weights)
    rounds: int = 0
    #: a multi-turn episode's own mask and facts (an episode is generated whole, in one call)
    response_mask: list[int] | None = None
    info: dict[str, Any] | None = None

    def extend(self, c: Completion, version: int, max_tokens: int) -> None:
        """Append one call's tokens, at most ``max_tokens`` in all (a call may sample past the budget:
        what it sampled beyond is dropped, as a call with that budget would not have sampled it)."""
        room = max_tokens - len(self.tokens)
        ids = list(c.token_ids)[:room]
        cut = len(ids) < len(c.token_ids)
        self.tokens += ids
        if c.log_probs is None or self.log_probs is None:
            self.log_probs = None
        else:
            self.log_probs += list(c.log_probs)[:room]
        self.versions += [version] * len(ids)
        self.text += c.text
        self.finish_reason = "length" if cut else c.finish_reason
        self.rounds += 1
        if c.response_mask is not None:
            self.response_mask, self.info = list(c.response_mask), c.info
        # Done: stopped (eos or a stop string), the whole budget used, or nothing generated at all.
        self.done = self.finish_reason != "length" or len(self.tokens) >= max_tokens or not c.token_ids

    def completion(self, tokenizer: Any = None) -> Completion:
        """As a completion; ``tokenizer`` decodes the whole text of a response continued across calls
        (the calls' texts may split a character)."""
        text = self.text
        if tokenizer is not None and self.rounds > 1:
            text = tokenizer.decode(self.tokens, skip_special_tokens=True)
        return Completion(
            prompt_ids=list(self.prompt),
            token_ids=list(self.tokens),
            log_probs=self.log_probs,
            finish_reason=self.finish_reason,
            text=text,
            response_mask=self.response_mask,
            info=self.info,
            versions=list(self.versions),
        )


class VersionedRollout:
    """A rollout role whose completions carry ``versions``, generated in chunks when ``chunk_tokens`` is
    set. Every other attribute is the wrapped role's (the weight transports use its group)."""

    def __init__(
        self, rollout: Any, clock: PolicyClock, chunk_tokens: int | None = None, tokenizer: Any = None
    ):
        self.rollout, self.clock, self.chunk_tokens, self.tokenizer = rollout, clock, chunk_tokens, tokenizer
        #: generate calls made (a chunked response takes several)
        self.calls = 0
        #: seconds spent waiting for the clock (a weight sync held the rollout)
        self.wait_seconds = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.rollout, name)

    @contextlib.contextmanager
    def _hold(self) -> Iterator[int]:
        start = time.perf_counter()
        with self.clock.generating() as version:
            self.wait_seconds += time.perf_counter() - start
            self.calls += 1
            yield version

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, multi_modal: Sequence | None = None
    ) -> list[list[Completion]]:
        """As ``RolloutRole.generate``; ``result[i][j].versions`` the version of each token. ``multi_modal``:
        each prompt's images, sent again with every continuation of its responses."""
        media = () if multi_modal is None else (list(multi_modal),)
        chunk = self.chunk_tokens
        if chunk is None or chunk >= params.max_tokens:
            with self._hold() as version:
                groups = self.rollout.generate(prompts, params, *media)
            return [[_stamped(c, version) for c in group] for group in groups]
        return self._generate_in_chunks(prompts, params, chunk, multi_modal)

    def run_episodes(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        agent: Any,
        tokenizer_path: str,
        rows: Sequence[dict[str, Any]] | None = None,
        multi_modal: Sequence | None = None,
    ) -> list[list[Completion]]:
        """As ``RolloutRole.run_episodes``, each episode in one call (its tokens share a version)."""
        media = {} if multi_modal is None else {"multi_modal": list(multi_modal)}
        with self._hold() as version:
            groups = self.rollout.run_episodes(prompts, params, agent, tokenizer_path, rows=rows, **media)
        return [[_stamped(c, version) for c in group] for group in groups]

    def _generate_in_chunks(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        chunk: int,
        multi_modal: Sequence | None = None,
    ) -> list[list[Completion]]:
        # The first call samples n per prompt as an uninterrupted call would; later calls continue each
        # unfinished response alone, seeded from (call seed, round, response), so a run reproduces.
        first = attrs.evolve(params, max_tokens=chunk)
        with self._hold() as version:
            groups = self.rollout.generate(
                prompts, first, *(() if multi_modal is None else (list(multi_modal),))
            )
        # Each response keeps the prompt as the engine read it (with images, expanded: what the trainer
        # reads); a continuation sends the prompt's own ids, and its images, again.
        partials = [[PartialResponse(list(c.prompt_ids)) for c in group] for group in groups]
        sent = [(list(p), None if multi_modal is None else multi_modal[i]) for i, p in enumerate(prompts)]
        origin = {id(r): sent[i] for i, row in enumerate(partials) for r in row}
        for row, group in zip(partials, groups, strict=True):
            for partial, completion in zip(row, group, strict=True):
                partial.extend(completion, version, params.max_tokens)
        flat = [p for row in partials for p in row]
        rounds = 0
        while True:
            active = [p for p in flat if not p.done]
            if not active:
                break
            rounds += 1
            budget = min(chunk, min(params.max_tokens - len(p.tokens) for p in active))
            seed = None if params.seed is None else derived_seed(params.seed, rounds)
            cont = attrs.evolve(params, n=1, max_tokens=budget, seed=seed)
            requests = [origin[id(p)] for p in active]
            media = [] if multi_modal is None else [[m for _, m in requests]]
            with self._hold() as version:
                results = self.rollout.generate(
                    [ids + p.tokens for (ids, _), p in zip(requests, active, strict=True)], cont, *media
                )
            for partial, (completion,) in zip(active, results, strict=True):
                partial.extend(completion, version, params.max_tokens)
        return [[p.completion(self.tokenizer) for p in row] for row in partials]


def _stamped(c: Completion, version: int) -> Completion:
    return attrs.evolve(c, versions=[version] * len(c.token_ids))

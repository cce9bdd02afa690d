"""A rollout stream that outlives a step, on the pool the trainer shares (``trainer.mode: stream``).

Requests are drawn from the prompt stream and kept in flight across steps. A step's collect runs
*rounds* until ``data.train_batch_size`` groups are finished; every round first tops the stream up to
``train_batch_size + trainer.stream.over_sampling`` untrained groups, then makes one generate call that
starts the new groups (``rollout.n`` responses each) and continues every unfinished response, each by at
most ``trainer.rollout_chunk_tokens`` tokens. Groups finished in a round are scored at once (and an
algorithm that filters groups, DAPO's dynamic sampling, drops them there; the next round refills from the
stream). The step's :class:`~rlcore.stream.policies.StreamPolicy` picks which finished groups it trains
on; everything else stays: unfinished responses keep their tokens, per-token log-probs and versions, and
continue in the next step's rounds under the new weights (the continued prefix is prefilled again: the
weight load invalidated the engine's cache). That is abort-and-continue through the plain ``generate``
contract, so it runs on every rollout engine; with colocated roles the rollout's memory is released for
the update between the two steps, as in a synchronous run.

What is cut, carried and trained depends only on the seeds and the token counts: a round is a fixed
number of tokens, not a span of time, and the driver runs the rounds and the updates in turn. The same
command gives the same run twice (the reproducible schedule the suite's asynchronous learning tests use).

The staleness bound: a step updating version ``v`` trains no group with a token older than
``v - trainer.max_staleness``; at the start of each step such groups (finished or not) are dropped and
their prompts generated again from the start, counted in ``stream/dropped_stale``.
"""

from __future__ import annotations

import collections
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rlcore.api import Batch
from rlcore.flows.phases import assemble_generated, prompt_rows, prompt_token_ids
from rlcore.rollout.partial import PartialResponse
from rlcore.stream.groups import Group
from rlcore.stream.lengths import length_metrics, version_lag_metrics

STREAM_FILE = "stream.jsonl"


class RolloutStream:
    """The groups in flight, and the rounds that finish them.

    ``draw()`` returns the next batch of prompts from the training data; ``rows(indices)`` rebuilds
    prompt rows from their dataset ``index`` values (a resumed run's in-flight prompts). ``finish(ctx,
    batch)`` scores generated rows (the algorithm's score, with its shaping); ``keep(ctx, group_batch)``
    says whether a scored group may be trained (``False``: filtered out, its prompt consumed).
    """

    def __init__(
        self,
        *,
        batch_size: int,
        over_sampling: int,
        chunk_tokens: int,
        max_staleness: int,
        policy: Any,
        draw: Callable[[], Batch],
        rows: Callable[[Sequence[int]], list[Batch]],
        finish: Callable[[Any, Batch], Batch],
        keep: Callable[[Any, Batch], bool],
        agent: Any = None,
        log_path: str | os.PathLike | None = None,
        origin: float | None = None,
        max_filtered: int | None = None,
    ):
        self.batch_size, self.over_sampling = batch_size, over_sampling
        self.chunk_tokens, self.max_staleness, self.policy = chunk_tokens, max_staleness, policy
        self.draw, self.rows, self.finish, self.keep, self.agent = draw, rows, finish, keep, agent
        self.log_path = None if log_path is None else Path(log_path)
        self.origin = time.perf_counter() if origin is None else origin
        #: a step that filters out more groups than this stops with an error (a task no group can pass)
        self.max_filtered = max_filtered if max_filtered is not None else 16 * (batch_size + over_sampling)
        self.groups: list[Group] = []
        self._queue: collections.deque[Batch] = collections.deque()
        self._seq = 0
        self._round = 0
        #: prompts regenerated from the start after a resume (their partial responses were not saved)
        self.regenerated = 0

    # -- a step ----------------------------------------------------------------------------------
    def collect(self, ctx: Any) -> Batch:
        """The step's ``batch_size`` finished groups, ``batch_size * n`` rows, scored; metrics ``stream/*``
        recorded into ``ctx``. ``ctx.version`` is the policy version the rollout holds and the step updates."""
        step, version = ctx.step, ctx.version
        stale = self._drop_stale(step, version)
        admitted_before, rounds_before, filtered = self._seq, self._round, 0
        finished_now: list[Group] = []
        while True:
            self._admit(step)
            ready = [g for g in self.groups if g.scored is not None]
            if len(ready) >= self.batch_size:
                break
            finished, dropped = self._run_round(ctx)
            finished_now += finished
            filtered += dropped
            if filtered > self.max_filtered:
                raise RuntimeError(
                    f"the stream filtered out {filtered} groups in step {step} without finding "
                    f"{self.batch_size} to train on: every group the algorithm scored was rejected "
                    "(DAPO's dynamic sampling drops groups whose responses all got the same reward); check "
                    "the reward function, or set algorithm.filter_groups.enable=false"
                )
        chosen = list(self.policy.select(ready, self.batch_size, version))
        self._check_choice(chosen, ready)
        for g in chosen:
            self._leave(g, "trained", step)
        batch = Batch.concat([g.scored for g in chosen])
        unfinished = [g for g in self.groups if g.scored is None]
        metrics = {
            "stream/admitted": self._seq - admitted_before,
            "stream/rounds": self._round - rounds_before,
            "stream/carried_over": len(self.groups),
            "stream/carried_unfinished": len(unfinished),
            "stream/carried_finished": len(self.groups) - len(unfinished),
            "stream/trained_from_earlier_steps": sum(g.admitted_step < step for g in chosen),
            "stream/dropped_stale": stale,
            "stream/dropped_filtered": filtered,
            "stream/regenerated_on_resume": self.regenerated,
        }
        metrics.update(length_metrics(chosen, finished_now, unfinished))
        metrics.update(version_lag_metrics(chosen, version))
        ctx.record(metrics)
        self.regenerated = 0
        return batch

    def _drop_stale(self, step: int, version: int) -> int:
        """Drop the groups a step updating ``version`` may not train; their prompts go back to the front
        of the queue, to be generated again. Returns how many."""
        oldest_allowed = version - self.max_staleness
        stale = [g for g in self.groups if g.oldest_version is not None and g.oldest_version < oldest_allowed]
        for g in reversed(stale):
            self._leave(g, "stale", step)
            self._queue.appendleft(_fresh(g.prompt))
        return len(stale)

    def _admit(self, step: int) -> None:
        """Top the stream up to ``batch_size + over_sampling`` untrained groups."""
        while len(self.groups) < self.batch_size + self.over_sampling:
            if not self._queue:
                prompts = self.draw()
                self._queue.extend(prompts.index([i]) for i in range(len(prompts)))
            row = self._queue.popleft()
            ids = prompt_token_ids(row)[0]
            self.groups.append(Group(self._seq, row, ids, step, time.perf_counter()))
            self._seq += 1

    # -- a round ---------------------------------------------------------------------------------
    def _run_round(self, ctx: Any) -> tuple[list[Group], int]:
        """One generate call that starts the new groups and continues every unfinished response; then
        score the groups that finished. Returns the finished groups kept and how many were filtered out."""
        self._round += 1
        max_tokens = ctx.config.rollout.max_response_length
        chunk = min(self.chunk_tokens, max_tokens)
        new = [g for g in self.groups if not g.started]
        going = [(g, r) for g in self.groups if g.started for r in g.responses if not r.done]
        with ctx.phase("generate"):
            ctx.memory.use("generate")
            if self.agent is not None:  # episodes start in calls of their own (below)
                if new:
                    self._start_episodes(ctx, new)
                if going:
                    self._continue(ctx, [], going, chunk, max_tokens)
            elif going:
                self._continue(ctx, new, going, chunk, max_tokens)
            elif new:
                self._start(ctx, new, chunk, max_tokens)
        done = [g for g in self.groups if g.done and g.scored is None]
        if not done:
            return [], 0
        return self._score(ctx, done)

    def _name(self, ctx: Any, new: list[Group]) -> None:
        for g, uid in zip(new, ctx.new_uids(len(new)), strict=True):
            g.prompt.objects["uid"] = [uid]

    def _start(self, ctx: Any, new: list[Group], chunk: int, max_tokens: int) -> None:
        """Nothing in flight: one call samples ``n`` per new prompt, as the synchronous generate phase
        does, drawing its seed, then the group ids, in that phase's order: with every response finished in
        its first round, a step samples what a synchronous step would."""
        params = ctx.sampling_params(max_tokens=chunk)
        self._name(ctx, new)
        results = ctx.rollout.generate([g.ids for g in new], params, *_media([g for g in new]))
        for g, completions in zip(new, results, strict=True):
            for c in completions:
                g.responses.append(self._response(g, c, ctx.version, max_tokens))

    def _continue(self, ctx: Any, new: list[Group], going: list, chunk: int, max_tokens: int) -> None:
        """Responses in flight, and maybe new groups: one call for all of them, each new group's ``n``
        responses as ``n`` requests of one sample. Two calls in turn would decode twice as many steps
        for the round as one (measured on an H200: 4.7 against 2.6 ms a token step at 0.5B), as the
        engine batches only the requests of one call."""
        n = ctx.config.rollout.n
        budget = chunk if new else min(chunk, max(max_tokens - len(r.tokens) for _, r in going))
        params = ctx.sampling_params(n=1, max_tokens=budget)
        self._name(ctx, new)
        prompts = [g.ids for g in new for _ in range(n)] + [g.ids + r.tokens for g, r in going]
        # A continued response is its prompt's ids and tokens so far, with the prompt's images again.
        groups = [g for g in new for _ in range(n)] + [g for g, _ in going]
        results = ctx.rollout.generate(prompts, params, *_media(groups))
        starts, goes = results[: len(new) * n], results[len(new) * n :]
        for k, g in enumerate(new):
            for (c,) in starts[k * n : (k + 1) * n]:
                g.responses.append(self._response(g, c, ctx.version, max_tokens))
        for (_, r), (c,) in zip(going, goes, strict=True):
            r.extend(c, ctx.version, max_tokens)

    def _start_episodes(self, ctx: Any, new: list[Group]) -> None:
        """Multi-turn episodes run whole in their first round (their turns share a version)."""
        params = ctx.sampling_params()
        self._name(ctx, new)
        model = ctx.config.model
        rows = [prompt_rows(g.prompt)[0] for g in new] if self.agent.uses_program else None
        media = _media(new)  # each prompt's images, sent with every model turn of its episodes
        results = ctx.rollout.run_episodes(
            [g.ids for g in new],
            params,
            self.agent,
            model.tokenizer_path or model.path,
            rows=rows,
            **({"multi_modal": media[0]} if media else {}),
        )
        for g, completions in zip(new, results, strict=True):
            for c in completions:
                # An agent program's episode starts from the prompt its agent sent (c.prompt_ids).
                r = PartialResponse(list(c.prompt_ids))
                r.extend(c, ctx.version, len(c.token_ids))
                g.responses.append(r)

    @staticmethod
    def _response(g: Group, c: Any, version: int, max_tokens: int) -> PartialResponse:
        # The prompt as the engine read it (a prompt with images, its image tokens expanded): the
        # sequence the trainer reads; continuations send the group's own ids again.
        r = PartialResponse(list(c.prompt_ids))
        r.extend(c, version, max_tokens)
        return r

    def _score(self, ctx: Any, done: list[Group]) -> tuple[list[Group], int]:
        """Score the groups finished this round in one call and keep those the algorithm accepts."""
        # Prompt rows of different widths: concat pads them left with the run's pad id.
        pad = {"pad_token_id": ctx.pad_token_id}
        prompts = Batch.concat(
            [Batch(g.prompt.tensors, g.prompt.objects, {**g.prompt.meta, **pad}) for g in done]
        )
        completions = [g.completions(ctx.tokenizer) for g in done]
        batch = self.finish(ctx, assemble_generated(ctx, prompts, completions))
        n = len(done[0].responses)
        kept, filtered, now = [], 0, time.perf_counter()
        for i, g in enumerate(done):
            rows = batch.index(list(range(i * n, (i + 1) * n)))
            g.finished_round, g.finished_step, g.finished_at = self._round, ctx.step, now
            if self.keep(ctx, rows):
                g.scored = rows
                kept.append(g)
            else:
                self._leave(g, "filtered", ctx.step)
                filtered += 1
        return kept, filtered

    # -- bookkeeping -----------------------------------------------------------------------------
    def _check_choice(self, chosen: list[Group], ready: list[Group]) -> None:
        ids = {id(g) for g in ready}
        if len(chosen) != self.batch_size or len({id(g) for g in chosen}) != len(chosen):
            raise ValueError(
                f"stream policy {type(self.policy).__name__} returned {len(chosen)} groups (distinct: "
                f"{len({id(g) for g in chosen})}) where the step trains {self.batch_size}"
            )
        if any(id(g) not in ids for g in chosen):
            raise ValueError(
                f"stream policy {type(self.policy).__name__} returned a group that is not finished; "
                "select only from the groups it is given"
            )

    def _leave(self, g: Group, outcome: str, step: int) -> None:
        """``g`` leaves the stream (trained, stale or filtered); its life goes to ``stream.jsonl``."""
        self.groups.remove(g)
        if self.log_path is None:
            return
        versions = [v for r in g.responses for v in r.versions]
        line = {
            "seq": g.seq,
            "uid": g.prompt.objects.get("uid", [None])[0],
            "index": g.prompt.objects.get("index", [None])[0],
            "outcome": outcome,
            "admitted_step": g.admitted_step,
            "finished_step": g.finished_step,
            "left_step": step,
            "admitted_at": round(g.admitted_at - self.origin, 6),
            "finished_at": None if g.finished_at is None else round(g.finished_at - self.origin, 6),
            "left_at": round(time.perf_counter() - self.origin, 6),
            "versions": [min(versions), max(versions)] if versions else None,
            "lengths": [len(r.tokens) for r in g.responses],
        }
        with self.log_path.open("a") as f:
            f.write(json.dumps(line) + "\n")

    # -- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The prompts drawn but not trained (in flight, then queued), by dataset ``index``: a resumed run
        generates them again from the start, so no prompt is trained twice or lost."""
        pending = [g.prompt for g in self.groups] + list(self._queue)
        return {"pending": [int(p.objects["index"][0]) for p in pending], "seq": self._seq}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.groups = []
        self._queue = collections.deque(self.rows([int(i) for i in state["pending"]]))
        self._seq = int(state["seq"])
        self.regenerated = len(self._queue)


def _media(groups: Sequence[Group]) -> tuple[list, ...]:
    """``generate``'s media argument for one request per group: ``(media,)`` when a prompt has images,
    ``()`` for text only (the call a text run always made)."""
    media = [g.media for g in groups]
    return (media,) if any(m is not None for m in media) else ()


def _fresh(row: Batch) -> Batch:
    """A prompt row without the group id of its dropped attempt (a new one is drawn when it restarts)."""
    return Batch(dict(row.tensors), {k: v for k, v in row.objects.items() if k != "uid"}, row.meta)


def read_stream(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The lines of a ``stream.jsonl``."""
    with Path(path).open() as f:
        return [json.loads(line) for line in f if line.strip()]


__all__ = ["STREAM_FILE", "RolloutStream", "read_stream"]

"""What the stream holds: a prompt's group of responses in flight, and each response's tokens so far.

A :class:`Group` is admitted with one prompt (a one-row prompt batch) and ``rollout.n`` responses; its
responses grow round by round (:mod:`rlcore.stream.stream`), each token stamped with the policy version
that sampled it and its log-prob under those weights. The group is *finished* once every response is
(stopped, or at its length budget), then scored; a step trains on finished groups only, so a GRPO group
is always whole.
"""

from __future__ import annotations

from typing import Any

import attrs

from rlcore.api import Batch, Completion


@attrs.define(eq=False)
class Response:
    """One response being generated, across rounds and weight versions."""

    tokens: list[int] = attrs.Factory(list)
    log_probs: list[float] | None = attrs.Factory(list)
    versions: list[int] = attrs.Factory(list)
    finish_reason: str = "length"
    text: str = ""
    done: bool = False
    #: generate calls it took (more than one: it was continued, perhaps under newer weights)
    rounds: int = 0
    #: a multi-turn episode's own mask and facts (it is generated whole, in one round)
    response_mask: list[int] | None = None
    info: dict[str, Any] | None = None

    def extend(self, c: Completion, version: int, max_tokens: int) -> None:
        """Append one round's tokens (at most ``max_tokens`` in all: a round may sample past the budget)."""
        room = max_tokens - len(self.tokens)
        ids = list(c.token_ids)[:room]
        cut = len(ids) < len(c.token_ids)
        self.tokens += ids
        self.log_probs = (
            None
            if c.log_probs is None or self.log_probs is None
            else self.log_probs + list(c.log_probs)[:room]
        )
        self.versions += [version] * len(ids)
        self.text += c.text
        self.finish_reason = "length" if cut else c.finish_reason
        if c.response_mask is not None:
            self.response_mask, self.info = list(c.response_mask), c.info
        # Done: stopped (eos or a stop string), the budget used, or nothing generated at all.
        self.done = self.finish_reason != "length" or len(self.tokens) >= max_tokens or not c.token_ids


@attrs.define(eq=False)
class Group:
    """One prompt's ``n`` responses in the stream."""

    #: admission number, unique and increasing over the run (the default policy's order)
    seq: int
    #: the prompt row, as the prompt loader collates it (one row; its objects carry ``uid``)
    prompt: Batch
    #: the prompt's token ids, without padding
    ids: list[int]
    admitted_step: int
    admitted_at: float
    responses: list[Response] = attrs.Factory(list)
    #: the stream's round (counted over the run) in which the last response finished
    finished_round: int | None = None
    finished_step: int | None = None
    finished_at: float | None = None
    #: the finished group's rows, generated and scored (``n`` rows of the standard layout)
    scored: Batch | None = None

    @property
    def started(self) -> bool:
        return bool(self.responses)

    @property
    def done(self) -> bool:
        return self.started and all(r.done for r in self.responses)

    @property
    def oldest_version(self) -> int | None:
        """The oldest version among its tokens (its staleness); ``None`` before any token."""
        versions = [min(r.versions) for r in self.responses if r.versions]
        return min(versions) if versions else None

    def completions(self) -> list[Completion]:
        """The responses as completions (text decoded by the caller when the rounds split characters)."""
        return [
            Completion(
                prompt_ids=list(self.ids),
                token_ids=list(r.tokens),
                log_probs=r.log_probs,
                finish_reason=r.finish_reason,
                text=r.text,
                response_mask=r.response_mask,
                info=r.info,
                versions=list(r.versions),
            )
            for r in self.responses
        ]

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
from rlcore.rollout.partial import PartialResponse


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
    responses: list[PartialResponse] = attrs.Factory(list)
    #: the stream's round (counted over the run) in which the last response finished
    finished_round: int | None = None
    finished_step: int | None = None
    finished_at: float | None = None
    #: the finished group's rows, generated and scored (``n`` rows of the standard layout)
    scored: Batch | None = None

    @property
    def media(self) -> dict | None:
        """The prompt's images (``{"image": [...]}``, :mod:`rlcore.vision`), or None for a text prompt."""
        media = (self.prompt.objects.get("multi_modal_data") or [None])[0]
        return media if (media or {}).get("image") else None

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

    def completions(self, tokenizer: Any = None) -> list[Completion]:
        """The responses as completions (``tokenizer`` decodes the texts of those continued across rounds)."""
        return [r.completion(tokenizer) for r in self.responses]

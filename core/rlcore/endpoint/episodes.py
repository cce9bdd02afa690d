"""One agent episode as the endpoint records it: the sampled token ids, never the text sent back.

A **trajectory** is a prompt followed by alternating parts::

    prompt | turn 0 | context 1 | turn 1 | context 2 | turn 2 ...
             sampled   template    sampled   template    sampled

A turn holds the engine's token ids and log-probs as sampled; a context holds what the chat template
writes between two turns (the end of the assistant turn, the tool or user messages the agent added, the
next generation prompt), tokenized alone. Each turn remembers the message index it occupies in later
requests and the assistant message the agent was given (:func:`~rlcore.endpoint.messages.turn_key`).

**Matching a request** (:meth:`Episode.prepare`): the request's messages are rendered with the chat
template, each remembered assistant turn replaced by a marker, and the text is cut at the markers. The
piece before the first marker must tokenize to the prompt, each piece between two markers to the
recorded context between those turns, and every marked message must be the one the agent was given. Then
the turns' own ids stand in for the markers and only the last piece (what the agent added since) is
tokenized: the sequence the model continues is exactly the one it sampled. No text of a sampled turn is
ever encoded again.

**An edit** (the agent changed an earlier message or the system prompt, wrote an assistant message
itself, or the template does not render earlier turns): the episode keeps the leading turns whose message and context
still match, and everything after them is rendered and tokenized as context (mask 0: never trained on,
no log-probs); the dropped turns' sampled tokens leave the trained row. ``history_edits`` counts such
requests and ``dropped_tokens`` the sampled tokens lost, in the episode's ``info``.

A request with ``n > 1`` opens ``n`` branches; the next request continues the one whose message it sends
back (the most recent branches are kept). The trained row is the branch of the latest request (its first
choice when it sampled several).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from rlcore.api import Completion
from rlcore.endpoint.messages import turn_key

#: How many branches an episode keeps for requests to continue (the most recent).
MAX_BRANCHES = 8
_MARK = "RLCORE_SAMPLED_TURN_{}_MARK"


class EpisodeLimit(ValueError):
    """A request the episode cannot serve: its response budget or turn limit is spent."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason  # "budget" | "max_turns"


@attrs.define(frozen=True)
class Part:
    """Token ids of a trajectory part: a sampled turn (``log_probs`` set, ``key`` and message ``index``)
    or a context (``log_probs`` None; ``retokenized`` when it replaces history the agent changed)."""

    ids: tuple[int, ...]
    log_probs: tuple[float, ...] | None = None
    key: Any = None
    index: int = -1
    finish_reason: str = "stop"
    retokenized: bool = False

    @property
    def sampled(self) -> bool:
        return self.log_probs is not None


@attrs.define(frozen=True)
class Trajectory:
    """``prompt`` then ``parts`` (turn, context, turn, ...)."""

    prompt: tuple[int, ...]
    parts: tuple[Part, ...] = ()

    @property
    def turns(self) -> list[Part]:
        return [p for p in self.parts if p.sampled]

    @property
    def response_len(self) -> int:
        return sum(len(p.ids) for p in self.parts)

    @property
    def sampled_tokens(self) -> int:
        return sum(len(p.ids) for p in self.parts if p.sampled)

    def ids(self) -> list[int]:
        out = list(self.prompt)
        for p in self.parts:
            out += p.ids
        return out

    def upto(self, turns: int) -> Trajectory:
        """The prompt and the first ``turns`` turns with the contexts between them."""
        return Trajectory(self.prompt, self.parts[: max(2 * turns - 1, 0)])


class Renderer:
    """Renders messages with ``tokenizer``'s chat template and tokenizes text alone (no special tokens added)."""

    def __init__(self, tokenizer: Any):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"the chat endpoint renders requests with the tokenizer's chat template, but this tokenizer "
                f"({type(tokenizer).__name__}) has none; use a chat model's tokenizer (model.tokenizer_path)"
            )
        self.tokenizer = tokenizer
        eos = tokenizer.eos_token_id
        self._eos_text = {int(eos): tokenizer.decode([eos])} if eos is not None else {}

    def encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text, add_special_tokens=False)) if text else ()

    def pieces(self, messages: Sequence[dict], tools: Any, marked: Sequence[int]) -> list[str] | None:
        """The rendered conversation (with the next generation prompt) cut at the messages ``marked``:
        ``len(marked) + 1`` pieces, or None when the template does not render each marked message's
        content exactly once (it drops or repeats earlier assistant turns)."""
        msgs = [dict(m) for m in messages]
        for j, i in enumerate(marked):
            msgs[i] = {"role": "assistant", "content": _MARK.format(j)}
        kwargs = {"tools": tools} if tools else {}
        text = self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **kwargs)
        pieces = []
        for j in range(len(marked)):
            head, sep, text = text.partition(_MARK.format(j))
            if not sep or _MARK.format(j) in text:
                return None
            pieces.append(head)
        return [*pieces, text]

    def after_turn(self, piece: str, turn: Sequence[int]) -> str:
        """``piece`` as it follows ``turn``: a turn that ended with the end-of-turn token already holds
        the start of what the template writes after an assistant message's content."""
        eos = self._eos_text.get(int(turn[-1])) if turn else None
        return piece[len(eos) :] if eos and piece.startswith(eos) else piece


@attrs.define
class Prepared:
    """What a request samples from: ``base`` (a recorded trajectory, or a new prompt) then ``context``.
    ``index``: the message index the reply will occupy; ``room``: response tokens left."""

    base: Trajectory
    context: tuple[int, ...]
    index: int
    room: int
    edited: bool = False

    def ids(self) -> list[int]:
        return self.base.ids() + list(self.context)


def _written_for_model(messages: Sequence[dict], last_turn: int) -> bool:
    """Whether an assistant message follows the last sampled turn: text the agent wrote in the model's
    name, which the model did not sample (an edit, never trained on as the model's)."""
    return any(m["role"] == "assistant" for m in messages[last_turn + 1 :])


class Episode:
    """The record of one episode: its branches, counters, and the trained row (:meth:`completion`).

    ``budget``: response tokens (everything after the prompt, model and context tokens together);
    ``max_model_len``: the engine's; ``max_turns``: sampled turns on one branch."""

    def __init__(
        self, episode_id: str, renderer: Renderer, *, budget: int, max_model_len: int, max_turns: int
    ):
        self.id, self.renderer = episode_id, renderer
        self.budget, self.max_model_len, self.max_turns = int(budget), int(max_model_len), int(max_turns)
        self.branches: list[Trajectory] = []
        self.final: Trajectory | None = None
        self.closed = False
        self.requests = self.history_edits = self.dropped_tokens = self.retokenized_tokens = 0
        self.tool_calls = 0
        #: why a request was refused (``budget``, ``max_turns``), if one was
        self.limit: str | None = None
        #: the request's seed counter (each request draws the next turn seed)
        self.turn = 0

    # -- matching --------------------------------------------------------------------------------
    def _kept(self, branch: Trajectory, messages: Sequence[dict], tools: Any) -> tuple[int, list[str] | None]:
        """How many leading turns of ``branch`` the request still holds unchanged, with the pieces of
        the request cut at them (-1: the prompt itself changed)."""
        turns = branch.turns
        echoed = 0
        for t in turns:
            m = messages[t.index] if t.index < len(messages) else None
            if m is None or m["role"] != "assistant" or turn_key(m) != t.key:
                break
            echoed += 1
        pieces = self.renderer.pieces(messages, tools, [t.index for t in turns[:echoed]])
        if pieces is None or self.renderer.encode(pieces[0]) != branch.prompt:
            return -1, None
        contexts = [p for p in branch.parts if not p.sampled]
        kept = 0
        for j in range(echoed):
            if (
                j
                and self.renderer.encode(self.renderer.after_turn(pieces[j], turns[j - 1].ids))
                != contexts[j - 1].ids
            ):
                break
            kept = j + 1
        return kept, pieces

    def prepare(self, messages: Sequence[dict], tools: Any) -> Prepared:
        """Match ``messages`` (normalised) against the recorded branches; see the module docstring."""
        best: tuple[int, Trajectory | None, list[str] | None] = (-1, None, None)
        for branch in self.branches:
            kept, pieces = self._kept(branch, messages, tools)
            if kept == len(branch.turns) and not _written_for_model(messages, branch.turns[-1].index):
                last = branch.turns[-1].ids
                context = self.renderer.encode(self.renderer.after_turn(pieces[-1], last))
                return self._checked(Prepared(branch, context, len(messages), 0))
            if kept > best[0]:
                best = (kept, branch, pieces)
        # No branch continues: start over from the longest unchanged lead. Only where the tokens the
        # request needs differ from the recorded ones is it an edit; resending an earlier state (a retry
        # of a turn) branches off without re-tokenizing anything.
        kept, branch, _ = best
        if kept <= 0:
            (whole,) = self.renderer.pieces(messages, tools, [])
            prompt = self.renderer.encode(whole)
            edited = bool(self.branches) and prompt != self.branches[0].prompt
            prepared = Prepared(Trajectory(prompt), (), len(messages), 0, edited)
        else:
            turns = branch.turns[:kept]
            pieces = self.renderer.pieces(messages, tools, [t.index for t in turns])
            context = self.renderer.encode(self.renderer.after_turn(pieces[-1], turns[-1].ids))
            recorded = [p for p in branch.parts if not p.sampled][kept - 1 : kept]
            edited = (
                not recorded or recorded[0].ids != context or _written_for_model(messages, turns[-1].index)
            )
            prepared = Prepared(branch.upto(kept), context, len(messages), 0, edited)
        return self._checked(prepared)

    def _checked(self, prepared: Prepared) -> Prepared:
        base = prepared.base
        if len(base.turns) >= self.max_turns:
            self.limit = "max_turns"
            raise EpisodeLimit(
                "max_turns", f"episode {self.id} reached agent.max_turns={self.max_turns} sampled turns"
            )
        used = base.response_len + len(prepared.context)
        prepared.room = min(self.budget - used, self.max_model_len - len(base.prompt) - used)
        if prepared.room < 1:
            self.limit = "budget"
            raise EpisodeLimit(
                "budget",
                f"episode {self.id} has no room for another turn: {used} response tokens of "
                f"rollout.max_response_length={self.budget} (prompt {len(base.prompt)} tokens, "
                f"rollout.max_model_len={self.max_model_len}) are used",
            )
        return prepared

    # -- recording -------------------------------------------------------------------------------
    def record(self, prepared: Prepared, completions: Sequence[Completion], messages: Sequence[dict]) -> None:
        """Add one branch per sampled choice (``completions[k]``, returned to the agent as ``messages[k]``,
        normalised); the first becomes the trained row. A closed episode records nothing."""
        if self.closed:
            return
        self.requests += 1
        if prepared.edited:
            self.history_edits += 1
            current = self.branches[0]
            self.dropped_tokens += max(current.sampled_tokens - prepared.base.sampled_tokens, 0)
            self.retokenized_tokens += (
                len(prepared.context) if prepared.base.parts else len(prepared.base.prompt)
            )
        new = []
        for c, message in zip(completions, messages, strict=True):
            parts = list(prepared.base.parts)
            if parts:
                parts.append(Part(tuple(prepared.context), retokenized=prepared.edited))
            log_probs = c.log_probs if c.log_probs is not None else [0.0] * len(c.token_ids)
            parts.append(
                Part(
                    tuple(int(t) for t in c.token_ids),
                    tuple(float(x) for x in log_probs),
                    key=turn_key(message),
                    index=prepared.index,
                    finish_reason=c.finish_reason,
                )
            )
            new.append(Trajectory(prepared.base.prompt, tuple(parts)))
            self.tool_calls += len(message.get("tool_calls") or ())
        self.branches = (new + [b for b in self.branches if b not in new])[:MAX_BRANCHES]
        self.final = new[0]

    def completion(self, fallback_prompt: Sequence[int], info: dict[str, Any], decode: Any) -> Completion:
        """The trained row: the final branch's prompt, then every part (``response_mask`` 1 on sampled
        turns, 0 on contexts; ``log_probs`` 0.0 on contexts). Without any request: ``fallback_prompt``
        and no response. ``info`` is extended with the episode's counters; ``decode`` maps ids to text."""
        t = self.final
        ids: list[int] = []
        mask: list[int] = []
        log_probs: list[float] = []
        for p in t.parts if t is not None else ():
            ids += p.ids
            mask += [int(p.sampled)] * len(p.ids)
            log_probs += list(p.log_probs) if p.sampled else [0.0] * len(p.ids)
        turns = t.turns if t is not None else []
        info = {
            **info,
            "turns": len(turns),
            "requests": self.requests,
            "tool_calls": self.tool_calls,
            "history_edits": self.history_edits,
            "dropped_tokens": self.dropped_tokens,
            "retokenized_tokens": self.retokenized_tokens,
            "final_text": decode(list(turns[-1].ids)) if turns else "",
        }
        return Completion(
            prompt_ids=list(t.prompt) if t is not None else [int(x) for x in fallback_prompt],
            token_ids=ids,
            log_probs=log_probs,
            finish_reason=turns[-1].finish_reason if turns else "stop",
            text=decode(ids),
            response_mask=mask,
            info=info,
        )

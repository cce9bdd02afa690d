"""One multi-turn episode over :meth:`RolloutEngine.agenerate`, and many of them at once.

An episode alternates model turns and tool observations after one prompt::

    prompt | model turn 1 | observation 1 | model turn 2 | ... | model turn k
             mask 1 ...     mask 0 ...      mask 1 ...           mask 1 ...

Model turns are the engine's token ids and log-probs, kept as generated; observations are the ids of the
tool messages rendered by the chat template (:class:`~rlcore.agents.observations.Observations`), never a
re-tokenization of the history. It ends at a turn without a tool call (``stop_reason="answer"``), after
``max_turns`` model turns (``"max_turns"``: a call in that last turn is not run), or when the response
budget (``params.max_tokens`` tokens of model and tool tokens together, and the engine's
``max_model_len``) leaves no room for the next observation plus one token (``"budget"``) or cuts a
model turn (``"length"``). The result is one :class:`~rlcore.api.Completion` with ``response_mask``
and ``info``.

A prompt with images (``multi_modal``, :mod:`rlcore.vision`) sends them with every model turn's request:
each request is the prompt's own ids (one image token per image) and the episode so far, and the engine
expands the image tokens again. The completion's ``prompt_ids`` are the prompt as the engine expanded it
(what the model read, and what the trainer trains on); the budget counts that expanded length. Tool
observations are text: a tool cannot return an image (yet).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from rlcore.agents.observations import Observations
from rlcore.agents.tool_calls import parse_tool_calls
from rlcore.agents.tools import Tool, call_tool
from rlcore.api import Completion, RolloutEngine, SamplingParams, request_seeds
from rlcore.api.requests import derived_seed


@attrs.define(frozen=True)
class EpisodeLimits:
    """Limits of every episode: ``max_turns`` model turns; ``max_model_len`` tokens of prompt and
    response (the engine's); the response budget is the request's ``max_tokens``."""

    max_turns: int
    max_model_len: int
    tool_call_format: str = "hermes"


def turn_seed(seed: int | None, turn: int) -> int | None:
    """The sampling seed of model turn ``turn`` (0-based) of the episode seeded ``seed``: turn 0 uses
    ``seed`` itself (a one-turn episode samples what single-turn generation would), later turns a
    value derived from ``(seed, turn)``."""
    if seed is None or turn == 0:
        return seed
    return derived_seed(seed, turn)


class AgentLoop:
    """Runs episodes of ``engine`` with ``tools``; ``tokenizer`` decodes turns and renders observations.

    ``max_concurrent`` bounds the episodes in flight (each awaits the engine or a tool); the engine
    batches the concurrent requests it receives (vLLM, SGLang), or serves them in turn (the HF rollout).
    """

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer: Any,
        tools: Mapping[str, Tool],
        limits: EpisodeLimits,
        observations: Observations,
        *,
        max_concurrent: int = 256,
    ):
        self.engine, self.tokenizer, self.tools = engine, tokenizer, dict(tools)
        self.limits, self.observations = limits, observations
        self.max_concurrent = int(max_concurrent)

    def close(self) -> None:
        """Close every tool (sandbox processes, sessions)."""
        for tool in self.tools.values():
            tool.close()

    def run(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        multi_modal: Sequence[Mapping | None] | None = None,
    ) -> list[list[Completion]]:
        """``params.n`` episodes per prompt (``result[i][j]``: prompt ``i``'s ``j``-th), each seeded as
        :func:`~rlcore.api.request_seeds` seeds the ``j``-th sample of a generate call. ``multi_modal``:
        each prompt's images (``{"image": [PIL.Image, ...]}`` or None), as :meth:`RolloutEngine.generate`
        takes them."""
        return asyncio.run(self.arun(prompts, params, multi_modal))

    async def arun(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        multi_modal: Sequence[Mapping | None] | None = None,
    ) -> list[list[Completion]]:
        gate = asyncio.Semaphore(self.max_concurrent)
        if multi_modal is not None and len(multi_modal) != len(prompts):
            raise ValueError(
                f"{len(multi_modal)} media entries for {len(prompts)} prompts; give one per prompt"
            )
        media = list(multi_modal) if multi_modal is not None else [None] * len(prompts)

        async def bounded(prompt: Sequence[int], seed: int | None, images: Mapping | None) -> Completion:
            async with gate:
                return await self.episode(prompt, attrs.evolve(params, n=1, seed=seed), images)

        tasks = [
            [bounded(prompt, seed, media[i]) for seed in request_seeds(params, i)]
            for i, prompt in enumerate(prompts)
        ]
        flat = await asyncio.gather(*(t for group in tasks for t in group))
        n = params.n
        return [list(flat[i * n : (i + 1) * n]) for i in range(len(prompts))]

    async def episode(
        self, prompt: Sequence[int], params: SamplingParams, multi_modal: Mapping | None = None
    ) -> Completion:
        """One episode from ``prompt`` with ``params`` (``n`` must be 1) and the prompt's images
        ``multi_modal`` (or None): see the module docstring."""
        if params.n != 1:
            raise ValueError(f"an episode samples one response; got n={params.n}")
        prompt = [int(t) for t in prompt]
        # Only a prompt with images passes them: text-only engines need not take the keyword.
        media = {"multi_modal": multi_modal} if multi_modal is not None else {}
        read = prompt  # the prompt as the engine read it (its image tokens expanded), set by turn 1
        budget = min(params.max_tokens, self.limits.max_model_len - len(prompt))
        ids: list[int] = []
        mask: list[int] = []
        log_probs: list[float] = []
        turns = calls = errors = 0
        stop_reason = "budget"
        turn_ids: list[int] = []
        while budget - len(ids) >= 1:
            request = attrs.evolve(params, max_tokens=budget - len(ids), seed=turn_seed(params.seed, turns))
            (out,) = await self.engine.agenerate(prompt + ids, request, **media)
            if media and not ids:
                # Turn 1 expanded the image tokens: the rest of the episode fits beside that prompt.
                read = [int(t) for t in out.prompt_ids]
                budget = min(budget, self.limits.max_model_len - len(read))
            turn_ids = list(out.token_ids)
            ids += turn_ids
            mask += [1] * len(turn_ids)
            log_probs += list(out.log_probs) if out.log_probs is not None else [0.0] * len(turn_ids)
            turns += 1
            if out.finish_reason == "length":
                stop_reason = "length"
                break
            text = self.tokenizer.decode(turn_ids, skip_special_tokens=False)
            tool_calls = parse_tool_calls(text, self.limits.tool_call_format)
            if not tool_calls:
                stop_reason = "answer"
                break
            if turns >= self.limits.max_turns:
                stop_reason = "max_turns"
                break
            results = await asyncio.gather(*(call_tool(self.tools, c) for c in tool_calls))
            calls += len(results)
            errors += sum(not r.ok for r in results)
            observation = self.observations.ids([self.observations.message(r) for r in results], turn_ids)
            if len(ids) + len(observation) + 1 > budget:
                break  # no room for the result and a reply: the episode ends at the call (budget)
            ids += observation
            mask += [0] * len(observation)
            log_probs += [0.0] * len(observation)
        info = {"turns": turns, "tool_calls": calls, "tool_errors": errors, "stop_reason": stop_reason}
        return Completion(
            prompt_ids=read,
            token_ids=ids,
            log_probs=log_probs if params.logprobs else None,
            finish_reason="length" if stop_reason in ("length", "budget") else "stop",
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            response_mask=mask,
            info={**info, "final_text": self.tokenizer.decode(turn_ids, skip_special_tokens=True)},
        )

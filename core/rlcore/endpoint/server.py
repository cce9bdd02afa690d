"""The HTTP endpoint: OpenAI chat completions served by one rollout engine, on its own event-loop thread.

Routes (every one needs ``Authorization: Bearer <api_key>``, the run's token; another gets 401):

- ``POST /episodes/<episode>/v1/chat/completions``: the episode is in the path, so an agent given
  ``base_url = http://127.0.0.1:<port>/episodes/<episode>/v1`` needs nothing else;
- ``POST /v1/chat/completions``: the episode from the ``X-Rlcore-Episode`` header, else the ``user`` field;
- ``GET /v1/models`` (and under ``/episodes/<episode>``): the one model, named ``policy``.

Only episodes the run opened (:meth:`ChatEndpoint.open`) are served: an unknown one is a 404, a finished
one (its agent timed out, or returned) a 409. Sampling follows the run (``rollout.temperature``,
``top_p``, ``top_k``; the seed of each episode's turns) unless ``honour_request_sampling``, in which case
the request's ``temperature`` and ``top_p`` are used where given: the trainer scores tokens at the run's
temperature, so such samples are off-policy (their behaviour log-probs are the recorded ones).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import hmac
import json
import threading
import uuid
from collections.abc import Awaitable
from typing import Any, TypeVar

import attrs

from rlcore.agents.episode import turn_seed
from rlcore.api import Completion, SamplingParams
from rlcore.endpoint.episodes import Episode, EpisodeLimit, Renderer
from rlcore.endpoint.messages import assistant_message, normalize_messages
from rlcore.endpoint.protocol import (
    ChatRequest,
    Choice,
    RequestError,
    error_body,
    finish_reason,
    parse_request,
    response_body,
    stream_events,
)

T = TypeVar("T")
EPISODE_HEADER = "X-Rlcore-Episode"


class LoopThread:
    """An asyncio event loop running on a daemon thread; :meth:`run` waits for a coroutine on it."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Awaitable[T]) -> cf.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Awaitable[T]) -> T:
        return self.submit(coro).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


def token_texts(tokenizer: Any, ids: list[int], text: str) -> list[str]:
    """Each token's share of ``text`` (the turn's text: special tokens and a stop string left out), by
    decoding growing prefixes: their concatenation is ``text`` exactly, so an agent that joins streamed
    pieces sends back the same content as one that read the whole message. A token that ends inside a
    multi-byte character gets ``""`` and the character goes with the token that completes it."""
    pieces, emitted = [], 0
    for k in range(len(ids)):
        current = tokenizer.decode(ids[: k + 1], skip_special_tokens=True)
        take = emitted if current.endswith("\ufffd") else min(len(current), len(text))
        take = max(take, emitted)
        pieces.append(text[emitted:take])
        emitted = take
    if pieces and emitted < len(text):
        pieces[-1] += text[emitted:]
    return pieces


@attrs.define
class _Opened:
    episode: Episode
    seed: int | None


class ChatEndpoint:
    """Serves ``engine`` (a :class:`~rlcore.api.RolloutEngine`) with ``tokenizer``'s chat template.

    ``sampling``: the run's sampling settings (temperature, top_p, top_k); ``api_key``: the token every
    request must carry (a fresh random one by default)."""

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        sampling: SamplingParams,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        honour_request_sampling: bool = False,
    ):
        import secrets

        self.engine, self.tokenizer, self.renderer = engine, tokenizer, Renderer(tokenizer)
        self.sampling, self.honour_request_sampling = sampling, honour_request_sampling
        self.host, self.port = host, int(port)
        self.api_key = api_key or f"rlcore-{secrets.token_urlsafe(24)}"
        self._episodes: dict[str, _Opened] = {}
        self._finished: set[str] = set()
        self._thread: LoopThread | None = None
        self._runner: Any = None

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> ChatEndpoint:
        """Bind and serve on the endpoint's thread; ``port`` 0 takes a free port (then :attr:`port`)."""
        if self._thread is None:
            self._thread = LoopThread("rlcore-chat-endpoint")
            self._thread.run(self._serve())
        return self

    async def _serve(self) -> None:
        from aiohttp import web

        app = web.Application(client_max_size=64 * 2**20)
        for prefix in ("", "/episodes/{episode}"):
            app.router.add_post(prefix + "/v1/chat/completions", self._chat)
            app.router.add_get(prefix + "/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    def close(self) -> None:
        if self._thread is None:
            return
        if self._runner is not None:
            self._thread.run(self._runner.cleanup())
        self._thread.stop()
        self._thread = None

    @property
    def loop_thread(self) -> LoopThread:
        if self._thread is None:
            raise RuntimeError("the chat endpoint is not started; call start() first")
        return self._thread

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def base_url(self, episode_id: str) -> str:
        """The ``base_url`` an ``openai`` client of episode ``episode_id`` is given."""
        return f"{self.url}/episodes/{episode_id}/v1"

    # -- episodes --------------------------------------------------------------------------------
    def open(
        self, episode_id: str, *, seed: int | None, budget: int, max_model_len: int, max_turns: int
    ) -> Episode:
        """Start recording episode ``episode_id`` (call on the endpoint's loop or before requests come)."""
        if episode_id in self._episodes or episode_id in self._finished:
            raise ValueError(f"episode id {episode_id!r} is already in use")
        episode = Episode(
            episode_id, self.renderer, budget=budget, max_model_len=max_model_len, max_turns=max_turns
        )
        self._episodes[episode_id] = _Opened(episode, seed)
        return episode

    def finish(self, episode_id: str) -> Episode:
        """Stop serving episode ``episode_id``; later requests for it get a 409."""
        opened = self._episodes.pop(episode_id)
        opened.episode.closed = True
        self._finished.add(episode_id)
        return opened.episode

    # -- HTTP ------------------------------------------------------------------------------------
    def _authorised(self, request: Any) -> bool:
        given = request.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode())

    @staticmethod
    def _error(status: int, message: str, code: str = "invalid_request_error") -> Any:
        from aiohttp import web

        return web.json_response(error_body(message, code), status=status)

    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        if not self._authorised(request):
            return self._error(
                401, "missing or wrong API key: use the api_key the run gave", "invalid_api_key"
            )
        return web.json_response(
            {"object": "list", "data": [{"id": "policy", "object": "model", "owned_by": "rlcore"}]}
        )

    async def _chat(self, request: Any) -> Any:
        from aiohttp import web

        if not self._authorised(request):
            return self._error(
                401, "missing or wrong API key: use the api_key the run gave", "invalid_api_key"
            )
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return self._error(400, "the request body is not JSON")
        try:
            chat = parse_request(body)
            episode_id = request.match_info.get("episode") or request.headers.get(EPISODE_HEADER) or chat.user
            if not episode_id:
                raise RequestError(
                    f"no episode: use the base_url the run gave (/episodes/<id>/v1), or send the episode id "
                    f"in the {EPISODE_HEADER} header or the user field"
                )
            opened = self._episodes.get(episode_id)
            if opened is None:
                status = 409 if episode_id in self._finished else 404
                state = "has finished (its agent returned or timed out)" if status == 409 else "is not open"
                raise RequestError(f"episode {episode_id!r} {state}", status, "episode_not_open")
            choices, usage = await self._sample(opened, chat)
        except RequestError as exc:
            return self._error(exc.status, str(exc), exc.code)
        except EpisodeLimit as exc:
            return self._error(400, str(exc), f"episode_{exc.reason}")
        response_id = f"chatcmpl-{uuid.uuid4().hex}"
        if not chat.stream:
            return web.json_response(response_body(chat, response_id, choices, usage))
        stream = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await stream.prepare(request)
        for event in stream_events(chat, response_id, choices, usage):
            await stream.write(event)
        await stream.write_eof()
        return stream

    async def _sample(self, opened: _Opened, chat: ChatRequest) -> tuple[list[Choice], dict[str, int]]:
        """Match the request against its episode, sample, record, and build the choices."""
        episode = opened.episode
        prepared = episode.prepare(chat.messages, chat.tools)
        run = self.sampling
        temperature, top_p = run.temperature, run.top_p
        if self.honour_request_sampling:
            temperature = run.temperature if chat.temperature is None else chat.temperature
            top_p = run.top_p if chat.top_p is None else chat.top_p
        params = SamplingParams(
            n=chat.n,
            temperature=temperature,
            top_p=top_p,
            top_k=run.top_k,
            max_tokens=min(chat.max_tokens or prepared.room, prepared.room),
            stop=chat.stop,
            logprobs=True,
            seed=turn_seed(opened.seed, episode.turn),
        )
        episode.turn += 1
        ids = prepared.ids()
        try:
            completions: list[Completion] = await self.engine.agenerate(ids, params)
        except ValueError as exc:  # the engine's checks (rlcore.api.requests): prompt too long ...
            raise RequestError(str(exc)) from exc
        choices, messages = [], []
        for k, c in enumerate(completions):
            text = (
                c.text
                if c.text or not c.token_ids
                else self.tokenizer.decode(c.token_ids, skip_special_tokens=True)
            )
            message = assistant_message(text, f"call_{episode.requests}_{k}", chat.parse_tool_calls)
            (normalized,) = normalize_messages([message])
            messages.append(normalized)
            tokens = list(
                zip(token_texts(self.tokenizer, list(c.token_ids), text), c.log_probs or [], strict=False)
            )
            choices.append(Choice(message, finish_reason(c.finish_reason, message), tokens))
        episode.record(prepared, completions, messages)
        completion_tokens = sum(len(c.token_ids) for c in completions)
        usage = {
            "prompt_tokens": len(ids),
            "completion_tokens": completion_tokens,
            "total_tokens": len(ids) + completion_tokens,
        }
        return choices, usage

"""Agent programs as rollouts: each sample is one run of the user's agent against the chat endpoint.

An agent is either a function (``agent.program: module:function``)::

    async def my_agent(base_url: str, api_key: str, row: dict) -> float | dict | None:
        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key)
        ...

or a command (``agent.command``), started once per episode with ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``
and ``RLCORE_EPISODE_ID`` in its environment (the ``openai`` client reads the first two) and the row as
JSON on stdin; the last line it prints, when it is JSON, is its value.

``row`` is the data row of the prompt: ``prompt`` (the chat messages), ``data_source``, ``ground_truth``,
``reward_model``, ``extra_info``, ``index``. The value an agent returns (a number, or a dict with a
``score``) is kept as ``info["returned"]``, which the ``agent`` reward provider turns into the reward;
with the default ``rule`` provider the row's reward function scores the final answer instead.

Every episode ends with a ``stop_reason``: ``answer`` (the agent returned), ``timeout`` (past
``agent.episode_timeout_s``: the task is cancelled, a command killed), ``budget`` or ``max_turns`` (the
endpoint refused a request and the agent gave up with an error), ``error`` (the agent raised, or a command
failed: ``info["error"]`` says how). Whatever it sampled before is kept as its row.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import os
import signal
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from rlcore.api import Completion, SamplingParams, request_seeds
from rlcore.endpoint.server import ChatEndpoint

#: Characters of an agent's error or a command's stderr kept in ``info["error"]``.
_ERROR_CHARS = 500


class AgentProgramError(RuntimeError):
    """An agent program could not be loaded or run (not a per-episode failure)."""


@attrs.define(frozen=True)
class EpisodeTask:
    """One prompt of a generate call: its token ids (the trained prompt when no request is made) and its
    data row, as the agent receives it."""

    prompt_ids: list[int]
    row: dict[str, Any]


def jsonable(value: Any) -> Any:
    """``value`` with numpy arrays and scalars (parquet columns) turned into lists and numbers."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return jsonable(value.tolist())
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def load_program(spec: str) -> Callable[..., Any]:
    """The ``async def`` named by ``agent.program`` (``module:function``)."""
    module_name, _, name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AgentProgramError(
            f"agent.program={spec!r}: cannot import {module_name!r} ({exc}); the module must be importable "
            f"in the rollout workers (installed, or on PYTHONPATH)"
        ) from exc
    fn = getattr(module, name, None)
    if fn is None:
        raise AgentProgramError(f"agent.program={spec!r}: module {module_name!r} has no {name!r}")
    if not inspect.iscoroutinefunction(fn):
        raise AgentProgramError(
            f"agent.program={spec!r} must be an async function (async def {name}(base_url, api_key, row)): "
            f"a blocking one would stall every other episode and could not be timed out"
        )
    return fn


def returned_value(value: Any, where: str) -> float | dict[str, Any] | None:
    """An agent's value as kept in ``info["returned"]``: a number, a JSON-able dict, or None."""
    if value is None or isinstance(value, dict):
        return jsonable(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise AgentProgramError(
        f"{where} returned {type(value).__name__} {value!r}; return a number, a dict or None"
    )


class AgentPrograms:
    """Runs the ``agent:`` section's program for many episodes at once over ``endpoint``.

    ``max_model_len``: the engine's; the response budget of each episode is the call's ``max_tokens``."""

    def __init__(self, endpoint: ChatEndpoint, agent: Any, max_model_len: int):
        self.endpoint, self.agent, self.max_model_len = endpoint, agent, int(max_model_len)
        self._function = load_program(agent.program) if agent.program is not None else None

    def close(self) -> None:
        self.endpoint.close()

    def run(self, tasks: Sequence[EpisodeTask], params: SamplingParams) -> list[list[Completion]]:
        """``params.n`` episodes per task (``result[i][j]``), seeded as generate seeds its samples, sampled
        with ``params``' temperature, top_p and top_k (the endpoint's run settings for this call)."""
        self.endpoint.sampling = params
        return self.endpoint.loop_thread.run(self.arun(tasks, params))

    async def arun(self, tasks: Sequence[EpisodeTask], params: SamplingParams) -> list[list[Completion]]:
        gate = asyncio.Semaphore(self.agent.max_concurrent_episodes)

        async def bounded(task: EpisodeTask, seed: int | None) -> Completion:
            async with gate:
                return await self.episode(task, seed, params)

        groups = [[bounded(t, s) for s in request_seeds(params, i)] for i, t in enumerate(tasks)]
        flat = await asyncio.gather(*(c for g in groups for c in g))
        n = params.n
        return [list(flat[i * n : (i + 1) * n]) for i in range(len(tasks))]

    async def episode(self, task: EpisodeTask, seed: int | None, params: SamplingParams) -> Completion:
        """One run of the agent; its record becomes one completion (see the module docstring)."""
        episode_id = uuid.uuid4().hex
        episode = self.endpoint.open(
            episode_id,
            seed=seed,
            budget=params.max_tokens,
            max_model_len=self.max_model_len,
            max_turns=self.agent.max_turns,
        )
        info: dict[str, Any] = {"episode_id": episode_id, "returned": None}
        row = jsonable(task.row)
        try:
            value = await asyncio.wait_for(self._call(episode_id, row), self.agent.episode_timeout_s)
            info["returned"] = returned_value(value, self.agent.program or "agent.command")
            info["stop_reason"] = "answer"
        except TimeoutError:
            info["stop_reason"] = "timeout"
        except AgentProgramError:
            raise
        except Exception as exc:  # the agent's own failure ends its episode, not the step
            info["stop_reason"] = episode.limit or "error"
            info["error"] = f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS]
        finally:
            self.endpoint.finish(episode_id)
        decode = self.endpoint.renderer.tokenizer
        return episode.completion(
            task.prompt_ids, info, lambda ids: decode.decode(ids, skip_special_tokens=True)
        )

    async def _call(self, episode_id: str, row: dict[str, Any]) -> Any:
        base_url, api_key = self.endpoint.base_url(episode_id), self.endpoint.api_key
        if self._function is not None:
            return await self._function(base_url=base_url, api_key=api_key, row=row)
        return await run_command(self.agent.command, base_url, api_key, episode_id, row)


async def run_command(
    argv: Sequence[str], base_url: str, api_key: str, episode_id: str, row: dict[str, Any]
) -> Any:
    """Run ``argv`` for one episode (see the module docstring); a cancelled run kills its process group."""
    env = {
        **os.environ,
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": api_key,
        "RLCORE_EPISODE_ID": episode_id,
    }
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,  # its own process group: a timeout kills the agent's children too
        )
    except OSError as exc:
        raise AgentProgramError(f"agent.command={list(argv)}: cannot start it ({exc})") from exc
    try:
        out, err = await proc.communicate(json.dumps(row).encode())
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise
    if proc.returncode != 0:
        tail = err.decode(errors="replace")[-_ERROR_CHARS:]
        raise RuntimeError(f"agent command exited with status {proc.returncode}: {tail}")
    lines = out.decode(errors="replace").strip().splitlines()
    if not lines:
        return None
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError:
        return None

"""The ``agent:`` section: multi-turn episodes with tool calls instead of single-turn generation."""

from __future__ import annotations

from typing import Any

import attrs

from rlcore.agents.tool_calls import FORMATS


def _positive(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    if not value > 0:
        raise ValueError(f"agent.{attribute.name} must be > 0, got {value!r}")


def _format(instance: Any, attribute: attrs.Attribute, value: str) -> None:
    if value not in FORMATS:
        raise ValueError(f"agent.{attribute.name} must be one of {', '.join(FORMATS)}; got {value!r}")


def _program(instance: Any, attribute: attrs.Attribute, value: str | None) -> None:
    if value is None:
        return
    module, sep, name = str(value).partition(":")
    if not sep or not module or not name.isidentifier():
        raise ValueError(
            f"agent.program must be 'module:function' (an importable module and an async function in it); "
            f"got {value!r}"
        )


def _argv(value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        import shlex

        value = shlex.split(value)
    argv = [str(v) for v in value]
    if not argv:
        raise ValueError("agent.command must name a program to run; got an empty command")
    return argv


def _port(instance: Any, attribute: attrs.Attribute, value: int) -> None:
    if not 0 <= value < 65536:
        raise ValueError(f"agent.{attribute.name} must be a port number (0 picks a free one), got {value!r}")


@attrs.define(kw_only=True)
class AgentConfig:
    """Multi-turn rollouts: each sample is an episode in which the model may call tools.

    A model turn whose text holds tool calls (``agent.tool_call_format``) has them run; their results are
    appended as tool messages and the model writes its next turn, until a turn without a call (the
    answer), ``max_turns`` model turns, or ``rollout.max_response_length`` tokens of response (model and
    tool tokens together). Only model tokens are trained on (``response_mask``). See docs/agents.md.
    """

    #: Run episodes with tools in every generation (training and validation) instead of single turns.
    enabled: bool = False
    #: Registered tools offered to the model (``rlcore plugins`` lists them): ``calculator``, ``python`` ...
    tools: list[str] = attrs.Factory(lambda: ["calculator"])
    #: Keyword arguments of each tool's constructor, by tool name (e.g. ``{python: {limits: {wall_s: 5}}}``).
    tool_options: dict[str, dict[str, Any]] = attrs.Factory(dict)
    #: Model turns per episode; a tool call in the last turn is not run.
    max_turns: int = attrs.field(default=4, validator=_positive)
    #: A tool message's content is cut to this many tokens.
    max_tool_response_tokens: int = attrs.field(default=256, validator=_positive)
    #: Seconds one tool call may take before it becomes an error message (overrides the tool's own).
    tool_timeout_s: float = attrs.field(default=30.0, validator=_positive)
    #: How tool calls are written in a model turn: ``hermes`` (``<tool_call>{"name", "arguments"}</tool_call>``,
    #: Qwen2.5/Qwen3's template).
    tool_call_format: str = attrs.field(default="hermes", validator=_format)
    #: Episodes in flight at once in each rollout worker (each awaits its engine or its tools).
    max_concurrent_episodes: int = attrs.field(default=256, validator=_positive)
    #: An agent program instead of the built-in loop: ``module:function``, an ``async def`` called as
    #: ``fn(base_url=, api_key=, row=)`` for each episode, that talks to the run's OpenAI-compatible
    #: endpoint (docs/agents.md, "Agent programs"). Setting it (or ``command``) turns ``enabled`` on.
    program: str | None = attrs.field(default=None, validator=_program)
    #: An agent program as an external command (a list of arguments, or one string split like a shell
    #: does), started once per episode with ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and
    #: ``RLCORE_EPISODE_ID`` set and the row as JSON on stdin; its last stdout line, if JSON, is its value.
    command: list[str] | None = attrs.field(default=None, converter=_argv)
    #: Seconds an agent program's episode may take; past it the episode ends with ``stop_reason``
    #: ``timeout`` (what it sampled so far is kept) and the step goes on.
    episode_timeout_s: float = attrs.field(default=600.0, validator=_positive)
    #: Use the ``temperature``/``top_p`` an agent's request asks for instead of the run's (its samples
    #: are then off-policy for a trainer scoring at ``rollout.temperature``).
    honour_request_sampling: bool = False
    #: Address the endpoint binds in each rollout worker (loopback: only this machine's agents reach it).
    endpoint_host: str = "127.0.0.1"
    #: Port of the endpoint; 0 picks a free one per rollout worker.
    endpoint_port: int = attrs.field(default=0, validator=_port)

    def __attrs_post_init__(self) -> None:
        if self.program is not None and self.command is not None:
            raise ValueError("agent.program and agent.command are two ways to give one agent; set only one")
        if self.uses_program:
            self.enabled = True

    @property
    def uses_program(self) -> bool:
        """Whether episodes are agent programs over the chat endpoint (else the built-in loop)."""
        return self.program is not None or self.command is not None


def data_with_tools(data: Any, agent: AgentConfig) -> Any:
    """The ``data:`` section whose chat template is offered the tools (``tools=`` in
    ``data.apply_chat_template_kwargs``) when ``agent.enabled``, so prompts tell the model what it may
    call; unchanged when the agent is off, is a program (which offers its own tools) or the user set
    ``tools`` there."""
    if not agent.enabled or agent.uses_program or "tools" in data.apply_chat_template_kwargs:
        return data
    from rlcore.agents.tools import tool_schemas

    kwargs = {**data.apply_chat_template_kwargs, "tools": tool_schemas(agent.tools)}
    return attrs.evolve(data, apply_chat_template_kwargs=kwargs)

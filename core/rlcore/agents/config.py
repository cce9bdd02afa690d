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


def data_with_tools(data: Any, agent: AgentConfig) -> Any:
    """The ``data:`` section whose chat template is offered the tools (``tools=`` in
    ``data.apply_chat_template_kwargs``) when ``agent.enabled``, so prompts tell the model what it may
    call; unchanged when the agent is off or the user set ``tools`` there."""
    if not agent.enabled or "tools" in data.apply_chat_template_kwargs:
        return data
    from rlcore.agents.tools import tool_schemas

    kwargs = {**data.apply_chat_template_kwargs, "tools": tool_schemas(agent.tools)}
    return attrs.evolve(data, apply_chat_template_kwargs=kwargs)

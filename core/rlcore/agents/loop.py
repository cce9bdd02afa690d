"""Building a rollout worker's :class:`~rlcore.agents.episode.AgentLoop` from the ``agent:`` section."""

from __future__ import annotations

from typing import Any

from rlcore.agents.config import AgentConfig
from rlcore.agents.episode import AgentLoop, EpisodeLimits
from rlcore.agents.observations import Observations
from rlcore.agents.tools import build_tools


def build_agent_loop(engine: Any, agent: AgentConfig, tokenizer_path: str) -> AgentLoop:
    """The agent loop of ``engine`` (a :class:`~rlcore.api.RolloutEngine`): the tools of
    ``agent.tools`` built in this process, the tokenizer loaded from ``tokenizer_path``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    tools = build_tools(agent.tools, agent.tool_options, agent.tool_timeout_s)
    limits = EpisodeLimits(
        max_turns=agent.max_turns,
        max_model_len=engine.spec.max_model_len,
        tool_call_format=agent.tool_call_format,
    )
    return AgentLoop(
        engine,
        tokenizer,
        tools,
        limits,
        Observations(tokenizer, agent.max_tool_response_tokens),
        max_concurrent=agent.max_concurrent_episodes,
    )

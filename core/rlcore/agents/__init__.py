"""Multi-turn agent rollouts: tools, tool-call parsing and episodes over ``RolloutEngine.agenerate``.

``Tool`` (:mod:`rlcore.agents.tools`) is what a plugin's ``register_tools`` hook registers;
:class:`~rlcore.agents.episode.AgentLoop` runs episodes in a rollout worker; ``AgentConfig`` is the
``agent:`` config section. See docs/agents.md.
"""

from rlcore.agents.config import AgentConfig
from rlcore.agents.tool_calls import ToolCall, parse_tool_calls
from rlcore.agents.tools import Tool, ToolError, ToolResult, build_tools, call_tool, tool_schemas

__all__ = [
    "AgentConfig",
    "Tool",
    "ToolError",
    "ToolCall",
    "ToolResult",
    "build_tools",
    "call_tool",
    "parse_tool_calls",
    "tool_schemas",
]

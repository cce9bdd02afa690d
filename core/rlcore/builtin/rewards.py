"""Built-in rewards (default plugin): rule scorers by data source and the ``rule`` provider.

Targets are lazy ``"module:attribute"`` strings, so loading plugins imports no scorer and no torch.
"""

from __future__ import annotations

from rlcore import hookimpl
from rlcore.rewards.config import RewardConfig

#: Data sources scored by the MATH rule (last ``\\boxed{}`` answer, normalised), as in verl.
MATH_DATA_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
#: Data sources scored by running the response's code against test cases in the sandbox (verl routes
#: codecontests, apps, codeforces and taco to its code scorer too).
CODE_DATA_SOURCES = ("code", "codecontests", "deepmind/code_contests", "apps", "codeforces", "taco")


@hookimpl
def register_reward_functions(register):
    register("openai/gsm8k", "rlcore.rewards.gsm8k:compute_score")
    for source in MATH_DATA_SOURCES:
        register(source, "rlcore.rewards.math_reward:compute_score")
    for source in CODE_DATA_SOURCES:
        register(source, "rlcore.rewards.code:compute_score")


@hookimpl
def register_reward_providers(register):
    register("rule", "rlcore.rewards.rule_provider:RuleRewardProvider", config=RewardConfig)
    # The value each agent program returned (agent.program / agent.command), docs/agents.md.
    register("agent", "rlcore.endpoint.reward:AgentReturnedReward", config=RewardConfig)

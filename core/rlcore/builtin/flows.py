"""Built-in algorithms (default plugin): the control flows of :mod:`rlcore.controller.flows`.

Registered lazily as ``"module:Class"`` strings, so loading plugins imports neither the flows nor torch.
"""

from rlcore import hookimpl

#: Algorithm name (a preset of :mod:`rlcore.algorithms.presets`) -> its control flow.
ALGORITHMS = {
    "ppo": "rlcore.controller.flows.ppo:PPO",
    "grpo": "rlcore.controller.flows.grpo:GRPO",
    "rloo": "rlcore.controller.flows.grpo:RLOO",
    "reinforce_plus_plus": "rlcore.controller.flows.grpo:ReinforcePlusPlus",
    "gspo": "rlcore.controller.flows.grpo:GSPO",
    "dapo": "rlcore.controller.flows.dapo:DAPO",
    "remax": "rlcore.controller.flows.remax:ReMax",
}


@hookimpl
def register_algorithms(register):
    for name, target in ALGORITHMS.items():
        register(name, target)

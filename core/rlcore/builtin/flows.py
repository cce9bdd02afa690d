"""Built-in algorithms (default plugin): the control flows of :mod:`rlcore.flows`.

Registered lazily as ``"module:Class"`` strings, so loading plugins imports neither the flows nor torch.
"""

from rlcore import hookimpl

#: Algorithm name (a preset of :mod:`rlcore.algorithms.presets`) -> its control flow.
ALGORITHMS = {
    "ppo": "rlcore.flows.ppo:PPO",
    "grpo": "rlcore.flows.grpo:GRPO",
    "rloo": "rlcore.flows.grpo:RLOO",
    "reinforce_plus_plus": "rlcore.flows.grpo:ReinforcePlusPlus",
    "gspo": "rlcore.flows.grpo:GSPO",
    "dapo": "rlcore.flows.dapo:DAPO",
    "remax": "rlcore.flows.remax:ReMax",
    "opd": "rlcore.flows.opd:OPD",
}


@hookimpl
def register_algorithms(register):
    for name, target in ALGORITHMS.items():
        register(name, target)

"""Built-in tasks (default plugin): each task's reward function, registered by its data source.

Targets are lazy ``"module:attribute"`` strings, so loading plugins imports no task module.
"""

from __future__ import annotations

from rlcore import hookimpl

#: data source -> scorer of the built-in tasks (:mod:`rlcore.tasks`).
TASK_REWARDS = {
    "rlcore/copy_word": "rlcore.tasks.copy_word:compute_score",
    "rlcore/tool_add": "rlcore.tasks.tool_add:compute_score",
    "rlcore/addition": "rlcore.tasks.addition:compute_score",
    "rlcore/tool_sum": "rlcore.tasks.tool_sum:compute_score",
    "rlcore/count_shapes": "rlcore.tasks.count_shapes:compute_score",
}


@hookimpl
def register_reward_functions(register):
    for data_source, target in TASK_REWARDS.items():
        register(data_source, target)

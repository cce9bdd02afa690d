"""Every hook a plugin can implement.

Hooks *register*, core *selects*: each hook receives a ``register`` callable and calls it once per
component it provides. ``register(name, target, **options)`` where ``target`` is the object itself or a
lazy ``"package.module:attribute"`` string, imported only when the component is used, so that loading a
plugin stays cheap. Core keeps one registry per hook and resolves names from config and the CLI.

Hooks only ever grow: a new argument is opt-in for implementations (pluggy passes only the arguments an
implementation names).
"""

import pluggy

hookspec = pluggy.HookspecMarker("rlcore")


@hookspec
def register_train_engines(register):
    """Register :class:`rlcore.api.TrainEngine` classes.

    ``register("fsdp", "rlcore_fsdp.engine:FSDPEngine", config=FSDPConfig)``; ``config`` is the attrs
    class of the engine's own config section (``fsdp:`` in YAML), light to import.
    """


@hookspec
def register_rollout_engines(register):
    """Register :class:`rlcore.api.RolloutEngine` classes, with ``config=`` their section's attrs class."""


@hookspec
def register_reward_providers(register):
    """Register :class:`rlcore.api.RewardProvider` classes (``config=`` optional)."""


@hookspec
def register_reward_functions(register):
    """Register rule scorers with verl's ``compute_score(data_source, solution_str, ground_truth,
    extra_info) -> float | dict`` signature, by data source name (``"openai/gsm8k"``)."""


@hookspec
def register_algorithms(register):
    """Register :class:`rlcore.api.Algorithm` presets (``"grpo"``, ``"ppo"`` ...)."""


@hookspec
def register_advantage_estimators(register):
    """Register advantage estimators: pure functions returning ``(advantages, returns)``, each ``[B, T]``."""


@hookspec
def register_policy_losses(register):
    """Register policy losses: pure functions returning ``(loss, metrics)``."""


@hookspec
def register_weight_transports(register):
    """Register :class:`rlcore.api.WeightTransport` classes (``"inprocess"``, ``"ray"``, ``"broadcast"``)."""


@hookspec
def register_device_platforms(register):
    """Register :class:`rlcore.api.DevicePlatform` classes (``"cpu"``, ``"cuda"``, ``"npu"`` ...)."""


@hookspec
def register_sandboxes(register):
    """Register :class:`rlcore.sandbox.Sandbox` classes (``"local"``, ``"http"``), built as
    ``cls(**options)`` by :func:`rlcore.sandbox.get_sandbox`; selected by ``sandbox.name``."""


@hookspec
def register_tools(register):
    """Register tools an agent may call (:class:`rlcore.agents.Tool` subclasses), by the name the model
    calls them with: ``register("calculator", "rlcore.agents.builtin_tools:Calculator")``. Runs select
    them with ``agent.tools``."""


@hookspec
def register_stream_policies(register):
    """Register the policies that pick which finished groups a ``trainer.mode: stream`` step trains on
    (:class:`rlcore.stream.StreamPolicy`: a class whose ``select(finished, need, version)`` returns the
    groups): ``register("fifo", "rlcore.stream.policies:Fifo")``. Runs select one with
    ``trainer.stream.policy``."""

"""Config values that name a registered component: the algorithm, its estimator and policy loss, the
engines, the reward provider, the weight transport, the device platform and the agent's tools.

Each is checked against the registry the run itself resolves it from, with the entry-point plugins
loaded (:func:`rlcore.plugins.registry`), so a name a third-party plugin registers is accepted exactly
when the run would find it. Only names are looked up: no component is imported, so checking stays as
cheap as loading the plugins.

>>> name_error("algorithm.name", "grpx")  # doctest: +ELLIPSIS
"'algorithm.name': unknown algorithm 'grpx'. Installed: dapo, grpo, .... Did you mean 'grpo'?"
"""

from __future__ import annotations

import difflib
from typing import Any

from rlcore.plugins import registry

#: Key path -> (registry key, values accepted besides the registered names). ``auto`` is resolved when
#: the run starts (:func:`rlcore.config.loader.resolve_rollout`, the transport and device choice).
NAMED_KEYS: dict[str, tuple[str, tuple[str, ...]]] = {
    "engine": ("train_engines", ()),
    "rollout.engine": ("rollout_engines", ("auto",)),
    "algorithm.name": ("algorithms", ()),
    "algorithm.adv_estimator": ("advantage_estimators", ()),
    "algorithm.policy_loss": ("policy_losses", ()),
    "reward.provider": ("reward_providers", ()),
    "reward_model.engine": ("train_engines", ()),
    "transport.name": ("weight_transports", ("auto",)),
    "trainer.device": ("device_platforms", ("auto",)),
    "agent.tools": ("tools", ()),  # a list: each entry is checked
    "trainer.stream.policy": ("stream_policies", ()),
}


def name_error(key: str, value: Any, shown: str | None = None) -> str | None:
    """What is wrong with ``key`` set to ``value``, as one line (plus advice lines when plugins failed to
    load); ``None`` when the name is registered or accepted.

    ``None`` values pass: for ``algorithm.adv_estimator`` and ``algorithm.policy_loss`` they mean "the
    preset's". A value of another type is left to the type check, which names the expected type.
    ``shown``: the key path the message names (an entry of a list key: ``agent.tools[1]``).
    """
    if value is None or not isinstance(value, str):
        return None
    registry_key, extra = NAMED_KEYS[key]
    names = registry(registry_key)
    if value in names or value in extra:
        return None
    installed = ", ".join(names.names()) or "(none)"
    also = f"; or {', '.join(extra)}" if extra else ""
    close = difflib.get_close_matches(value, [*names.names(), *extra], n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    line = f"'{shown or key}': unknown {names.kind} {value!r}. Installed: {installed}{also}.{hint}"
    # A plugin that failed to load (or is not installed) is the likely cause: say which, and what to do.
    advice = names.missing_advice(value, close[0] if close else None)
    return "\n    ".join([line, *(a.replace("\n", "\n    ") for a in advice)])


def _value(config: Any, key: str) -> Any:
    for part in key.split("."):
        config = getattr(config, part)
    return config


def check_names(config: Any, keys: tuple[str, ...] | None = None) -> list[str]:
    """One message per key of ``keys`` (default: every key of :data:`NAMED_KEYS`) whose value in
    ``config`` (an :class:`~rlcore.config.schema.RLConfig`) names nothing registered; for a list value
    (``agent.tools``), one per entry, named ``key[i]``."""
    errors = []
    for key in keys or tuple(NAMED_KEYS):
        value = _value(config, key)
        entries = enumerate(value) if isinstance(value, list | tuple) else [(None, value)]
        for i, item in entries:
            error = name_error(key, item, key if i is None else f"{key}[{i}]")
            if error is not None:
                errors.append(error)
    return errors

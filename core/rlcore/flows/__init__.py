"""Algorithm control flows, one module per family, and the resolution of a run's algorithm preset.

Each flow is an :class:`rlcore.api.Algorithm` whose ``step(ctx, prompts)`` reads top to bottom as named
phases (:mod:`rlcore.flows.phases`); they share one constructor, that of
:class:`rlcore.flows.base.Flow` (the preset and the actor's loss). They are registered as the
built-in algorithms by the default plugin :mod:`rlcore.builtin.flows` (``ALGORITHMS`` there), by the
preset names of :mod:`rlcore.algorithms.presets`.
"""

from __future__ import annotations

from typing import Any

import attrs


def resolve_preset(algorithm_config: Any, algorithm_cls: type) -> Any:
    """The run's :class:`~rlcore.algorithms.presets.AlgorithmPreset`: the algorithm's preset (by its
    ``preset_name``, or built from its ``defaults`` for a third-party algorithm) with the ``algorithm:``
    fields the user set merged over it.

    A field overrides the preset when it is set: not ``None``, or for fields whose schema default is a
    value (``gamma``, ``lam``, the ``kl_ctrl`` section), different from that default. Sections become
    the preset's own classes field by field. ``clip_ratio`` alone sets both clip bounds.
    """
    from rlcore.algorithms.presets import PRESETS, AlgorithmPreset

    name = getattr(algorithm_cls, "preset_name", None) or algorithm_config.name
    if name in PRESETS:
        base = PRESETS[name]
    else:
        base = AlgorithmPreset(name=algorithm_config.name, **dict(getattr(algorithm_cls, "defaults", {})))
    schema_defaults = type(algorithm_config)()
    preset_fields = {f.name for f in attrs.fields(AlgorithmPreset)}
    overrides: dict[str, Any] = {}
    for field in attrs.fields(type(algorithm_config)):
        value = getattr(algorithm_config, field.name)
        if field.name == "name" or field.name not in preset_fields or value is None:
            continue
        if value == getattr(schema_defaults, field.name):
            continue
        if attrs.has(type(value)):
            value = type(getattr(base, field.name))(**attrs.asdict(value))
        overrides[field.name] = value
    if "clip_ratio" in overrides:
        overrides.setdefault("clip_ratio_low", overrides["clip_ratio"])
        overrides.setdefault("clip_ratio_high", overrides["clip_ratio"])
    try:
        return attrs.evolve(base, **overrides)
    except ValueError as exc:
        hint = " Set algorithm.name=ppo for an estimator that needs a critic." if "critic" in str(exc) else ""
        raise ValueError(f"algorithm: {exc}.{hint}") from None

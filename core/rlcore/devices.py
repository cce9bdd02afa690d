"""Choosing the device platform for this process, and the device environment of a Ray worker."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from rlcore.api.device import DevicePlatform
from rlcore.plugins import registry


def get_platform(name: str = "auto") -> DevicePlatform:
    """The platform named ``name``, or with ``"auto"`` the available one with the highest priority."""
    platforms = registry("device_platforms")
    if name != "auto":
        cls = platforms.get(name)
        if not cls.is_available():
            raise RuntimeError(
                f"device platform {name!r} is installed but no device of that kind is available here "
                f"({_explain(cls)}); set trainer.device=auto or cpu"
            )
        return cls()
    available = [platforms.get(n) for n in platforms.names()]
    available = [cls for cls in available if _available(cls)]
    return max(available, key=lambda cls: cls.priority)()


def detection() -> list[dict[str, Any]]:
    """Every installed platform, highest priority first: ``name``, ``priority``, ``available``, ``why``
    (its :meth:`~rlcore.api.DevicePlatform.explain`) and ``chosen`` (what ``trainer.device=auto`` picks).
    What ``rlcore env`` prints to say which platform was detected and why."""
    platforms = registry("device_platforms")
    rows = []
    for name in platforms.names():
        cls = platforms.get(name)
        rows.append(
            {"name": name, "priority": cls.priority, "available": _available(cls), "why": _explain(cls)}
        )
    rows.sort(key=lambda row: -row["priority"])
    chosen = next((row for row in rows if row["available"]), None)
    for row in rows:
        row["chosen"] = row is chosen
    return rows


def ray_device_env(device: str, assigned: Mapping[str, Sequence[str]]) -> dict[str, str | None]:
    """The visible-devices environment of a Ray worker that Ray assigned ``assigned`` (resource name ->
    device ids, as ``ray.get_runtime_context().get_accelerator_ids()`` gives them).

    It is worked out before any platform's ``is_available`` runs, because asking a device runtime
    whether it has devices starts it, and it reads its visible-devices variables only then. So with
    ``device="auto"`` every installed platform whose ``ray_resource`` Ray assigned contributes its
    :meth:`~rlcore.api.DevicePlatform.ray_visible_devices`, lower priority first, so on a variable two
    platforms both set (CUDA and ROCm both set ``CUDA_VISIBLE_DEVICES``) the higher priority's answer
    wins; each platform sets only its own runtime's variables, so the others' are inert. A named
    platform contributes alone.
    """
    platforms = registry("device_platforms")
    if device == "auto":
        classes = sorted((platforms.get(n) for n in platforms.names()), key=lambda cls: cls.priority)
    else:
        classes = [platforms.get(device)]
    env: dict[str, str | None] = {}
    for cls in classes:
        ids = assigned.get(cls.ray_resource) if cls.ray_resource else None
        if ids:
            env.update(cls.ray_visible_devices([str(i) for i in ids]))
    return env


def apply_ray_device_env(device: str = "auto") -> dict[str, str | None]:
    """In a Ray worker, before the platform is chosen: set :func:`ray_device_env` for the devices Ray
    assigned this worker (a no-op outside Ray or without devices). Returns what it applied."""
    import ray

    if not ray.is_initialized():
        return {}
    env = ray_device_env(device, ray.get_runtime_context().get_accelerator_ids())
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    return env


def _available(cls: type[DevicePlatform]) -> bool:
    try:
        return bool(cls.is_available())
    except Exception:  # a broken vendor stack is "not available", with the reason from explain()
        return False


def _explain(cls: type[DevicePlatform]) -> str:
    try:
        return cls.explain()
    except Exception as exc:
        return f"{cls.__name__}.explain() raised {type(exc).__name__}: {exc}"

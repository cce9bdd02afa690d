"""Choosing the device platform for this process."""

from __future__ import annotations

from rlcore.api.device import DevicePlatform
from rlcore.plugins import registry


def get_platform(name: str = "auto") -> DevicePlatform:
    """The platform named ``name``, or with ``"auto"`` the available one with the highest priority."""
    platforms = registry("device_platforms")
    if name != "auto":
        cls = platforms.get(name)
        if not cls.is_available():
            raise RuntimeError(
                f"device platform {name!r} is installed but no device of that kind is available here; "
                f"set trainer.device=auto or cpu"
            )
        return cls()
    available = [platforms.get(n) for n in platforms.names()]
    available = [cls for cls in available if cls.is_available()]
    return max(available, key=lambda cls: cls.priority)()

"""Entry point of rlcore-rocm: registers the ``rocm`` device platform. Cheap to import (no torch)."""

from rlcore import hookimpl

RLCORE_PLUGIN_API = ">=1.0,<2"  # the rlcore plugin API versions this plugin works with


@hookimpl
def register_device_platforms(register):
    register("rocm", "rlcore_rocm.platform:ROCmPlatform")


def plugin_status() -> str | None:
    """``None`` on a machine with a ROCm GPU, else why not (``rlcore plugins`` shows it as a note)."""
    from rlcore_rocm.platform import ROCmPlatform

    return None if ROCmPlatform.is_available() else f"no device: {ROCmPlatform.explain()}"

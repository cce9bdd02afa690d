"""Entry point of rlcore-ascend: registers the ``ascend`` device platform and the ``hccl`` weight
transport. Cheap to import: neither torch nor torch_npu (which loads the CANN runtime) is imported."""

from rlcore import hookimpl
from rlcore.transports.config import TransportConfig

RLCORE_PLUGIN_API = ">=1.0,<2"  # the rlcore plugin API versions this plugin works with


@hookimpl
def register_device_platforms(register):
    register("ascend", "rlcore_ascend.platform:AscendPlatform")


@hookimpl
def register_weight_transports(register):
    register("hccl", "rlcore_ascend.transport:HCCLTransport", config=TransportConfig)


def plugin_status() -> str | None:
    """``None`` on a machine with an Ascend NPU, else why not (``rlcore plugins`` shows it as a note)."""
    from rlcore_ascend.detect import explain, npu_present

    return None if npu_present() else f"no device: {explain()}"

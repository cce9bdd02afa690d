"""Built-in weight transports (default plugin): ``inprocess``, ``ray``, ``broadcast`` and ``ipc``."""

from rlcore import hookimpl
from rlcore.transports.config import TransportConfig


@hookimpl
def register_weight_transports(register):
    register("inprocess", "rlcore.transports.inprocess:InProcessTransport", config=TransportConfig)
    register("ray", "rlcore.transports.ray_object_store:RayObjectStoreTransport", config=TransportConfig)
    register("broadcast", "rlcore.transports.broadcast:BroadcastTransport", config=TransportConfig)
    register("ipc", "rlcore.transports.ipc:IPCTransport", config=TransportConfig)

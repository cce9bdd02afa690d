"""Entry point of rlcore-fsdp: registers the ``fsdp`` train engine. Cheap to import (no torch)."""

from rlcore import hookimpl

from rlcore_fsdp.config import FSDPConfig

RLCORE_PLUGIN_API = ">=1.0,<2"  # the rlcore plugin API versions this plugin works with


@hookimpl
def register_train_engines(register):
    register("fsdp", "rlcore_fsdp.engine:FSDPEngine", config=FSDPConfig)

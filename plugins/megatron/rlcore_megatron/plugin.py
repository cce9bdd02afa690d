"""Entry point of rlcore-megatron: registers the ``megatron`` train engine. Cheap to import (no torch)."""

from rlcore import hookimpl

from rlcore_megatron.config import MegatronConfig

RLCORE_PLUGIN_API = ">=1.0,<2"  # the rlcore plugin API versions this plugin works with


@hookimpl
def register_train_engines(register):
    register("megatron", "rlcore_megatron.engine:MegatronEngine", config=MegatronConfig)

"""Entry point of rlcore-vllm: registers the ``vllm`` rollout engine. Cheap to import (no vllm)."""

from rlcore import hookimpl

from rlcore_vllm.config import VLLMConfig

RLCORE_PLUGIN_API = ">=1.0,<2"  # the rlcore plugin API versions this plugin works with


@hookimpl
def register_rollout_engines(register):
    register("vllm", "rlcore_vllm.engine:VLLMRollout", config=VLLMConfig)

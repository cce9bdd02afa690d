"""Entry point of rlcore-sglang: registers the ``sglang`` rollout engine and the ``sglang-distributed``
weight transport. Cheap to import (no sglang)."""

import importlib.util

from rlcore import hookimpl
from rlcore.transports.config import TransportConfig

from rlcore_sglang.config import SGLangConfig

RLCORE_PLUGIN_API = ">=1.0,<2"  # the rlcore plugin API versions this plugin works with
#: The plugin's own environment (`rlcore env build sglang`, docs/environments.md): SGLang and its pins
#: (transformers 5.12.1 for sglang 0.5.16) over the driver's environment, apart from the trainer's.
RLCORE_PLUGIN_ENV = ["rlcore-sglang[cuda]"]

#: What ``rlcore plugins`` and building the engine say where SGLang is missing.
INSTALL_HINT = (
    "sglang is not installed here: install it on a CUDA machine (pip install 'rlcore-sglang[cuda]'); "
    "SGLang has no CPU build. The sglang: config section works without it."
)


@hookimpl
def register_rollout_engines(register):
    register("sglang", "rlcore_sglang.engine:SGLangRollout", config=SGLangConfig)


@hookimpl
def register_weight_transports(register):
    register(
        "sglang-distributed", "rlcore_sglang.transport:SGLangDistributedTransport", config=TransportConfig
    )


def plugin_status() -> str | None:
    """``None`` when the engine can be built here, else what is missing (shown by ``rlcore plugins``).
    Looks for the package without importing it: importing sglang takes seconds and a CUDA torch."""
    return INSTALL_HINT if importlib.util.find_spec("sglang") is None else None

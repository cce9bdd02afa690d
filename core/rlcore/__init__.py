"""rlcore: reinforcement-learning post-training of LLMs with pluggable engines.

Importing ``rlcore`` is cheap (no torch): plugins import it for :data:`hookimpl`.
"""

import pluggy

__version__ = "0.1.0"

#: Version of the plugin API. A plugin declares the version it targets as the module attribute
#: ``RLCORE_PLUGIN_API`` of its entry-point module; a different major version is refused at load time.
PLUGIN_API_VERSION = 1

#: Marker for hook implementations: ``@rlcore.hookimpl def register_train_engines(register): ...``
hookimpl = pluggy.HookimplMarker("rlcore")

__all__ = ["PLUGIN_API_VERSION", "__version__", "hookimpl"]

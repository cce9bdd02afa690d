"""rlcore: reinforcement-learning post-training of LLMs with pluggable engines.

Importing ``rlcore`` is cheap (no torch): plugins import it for :data:`hookimpl`.
"""

import pluggy

__version__ = "0.1.0"

from rlcore.api import API_VERSION

#: The major of :data:`rlcore.api.API_VERSION`. A plugin declares the range of API versions it supports
#: as ``RLCORE_PLUGIN_API`` in its entry-point module (``">=1.0,<2"``; the integer ``1`` means the same);
#: a plugin whose range excludes this rlcore's API is refused at load time.
PLUGIN_API_VERSION = int(API_VERSION.split(".")[0])

#: Marker for hook implementations: ``@rlcore.hookimpl def register_train_engines(register): ...``
hookimpl = pluggy.HookimplMarker("rlcore")

__all__ = ["API_VERSION", "PLUGIN_API_VERSION", "__version__", "hookimpl"]

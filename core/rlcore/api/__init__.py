"""rlcore's public interfaces. Plugins import from here (and from :mod:`rlcore.testing`).

Names resolve lazily (PEP 562) so that importing one interface module, as the built-in device plugin
does, does not import torch: loading plugins stays cheap in every process.
"""

import importlib

#: The version of this interface: ``major.minor``. The minor grows when names or optional members are
#: added (a plugin built for 1.0 works with 1.3); the major grows when something a plugin relies on
#: changes or goes. A plugin declares the range it supports as ``RLCORE_PLUGIN_API`` in its entry-point
#: module (docs/plugins.md, "Compatibility"), and a plugin whose range excludes this version is refused.
API_VERSION = "1.1"

_EXPORTS = {
    "Algorithm": "rlcore.api.algorithm",
    "Batch": "rlcore.api.batch",
    "Completion": "rlcore.api.rollout_engine",
    "DevicePlatform": "rlcore.api.device",
    "DistInfo": "rlcore.api.train_engine",
    "EngineSpec": "rlcore.api.train_engine",
    "LoraSpec": "rlcore.api.train_engine",
    "LossFn": "rlcore.api.train_engine",
    "RewardProvider": "rlcore.api.reward",
    "RolloutEngine": "rlcore.api.rollout_engine",
    "RolloutSpec": "rlcore.api.rollout_engine",
    "SamplingParams": "rlcore.api.rollout_engine",
    "TrainEngine": "rlcore.api.train_engine",
    "WeightBucket": "rlcore.api.train_engine",
    "WeightTransport": "rlcore.api.weight_transport",
    "ROLLOUT_TAGS": "rlcore.api.requests",
    "check_prompts": "rlcore.api.requests",
    "check_quantization": "rlcore.api.requests",
    "check_sampling": "rlcore.api.requests",
    "check_tags": "rlcore.api.requests",
    "request_seeds": "rlcore.api.requests",
    "rollout_dtype": "rlcore.api.requests",
    "place_sequence_scores": "rlcore.api.reward",
}

__all__ = sorted([*_EXPORTS, "API_VERSION"])


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rlcore.api' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__

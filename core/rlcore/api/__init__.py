"""rlcore's public interfaces. Plugins import from here (and from :mod:`rlcore.testing`)."""

from rlcore.api.algorithm import Algorithm
from rlcore.api.batch import Batch
from rlcore.api.device import DevicePlatform
from rlcore.api.reward import RewardProvider, place_sequence_scores
from rlcore.api.rollout_engine import Completion, RolloutEngine, RolloutSpec, SamplingParams
from rlcore.api.train_engine import DistInfo, EngineSpec, LossFn, TrainEngine, WeightBucket
from rlcore.api.weight_transport import WeightTransport

__all__ = [
    "Algorithm",
    "Batch",
    "Completion",
    "DevicePlatform",
    "DistInfo",
    "EngineSpec",
    "LossFn",
    "RewardProvider",
    "RolloutEngine",
    "RolloutSpec",
    "SamplingParams",
    "TrainEngine",
    "WeightBucket",
    "WeightTransport",
    "place_sequence_scores",
]

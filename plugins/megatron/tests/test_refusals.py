"""What the Megatron engine refuses before it touches megatron-core: vision-language models (their Qwen-VL
vision tower is not a megatron-core module; docs/vision.md) and freezing a vision tower, each with the
engine to use instead."""

from __future__ import annotations

import pytest
from rlcore.api import DistInfo, EngineSpec
from rlcore.devices import get_platform
from rlcore_megatron.engine import MegatronEngine

pytest.importorskip("torchvision")  # the Qwen-VL processors' video half needs it (docs/vision.md)


def test_a_vision_language_model_is_refused_naming_the_engine_to_use(tmp_path):
    from rlcore.testing.tiny_vlm import build_tiny_vlm

    folder = build_tiny_vlm(tmp_path / "vlm")
    with pytest.raises(
        ValueError, match=r"'.*vlm': the megatron engine trains text models only.*--engine fsdp"
    ):
        MegatronEngine(EngineSpec(model_path=str(folder)), None, get_platform("cpu"), DistInfo())


def test_freezing_a_vision_tower_is_refused(tmp_path):
    from rlcore.testing.tiny import build_tiny_model

    folder = build_tiny_model(tmp_path / "text")
    with pytest.raises(ValueError, match=r"actor.freeze_vision_tower=true: the megatron engine trains text"):
        MegatronEngine(
            EngineSpec(model_path=str(folder), freeze_vision_tower=True),
            None,
            get_platform("cpu"),
            DistInfo(),
        )

"""A CPU device is refused with what to do, before megatron-core fails deep inside on ``torch.cuda``
(this pytest process never installs the test redirect that lets the other tests run Megatron on CPU)."""

import pytest
from rlcore.api import DistInfo, EngineSpec
from rlcore.devices import get_platform


def test_the_engine_on_a_cpu_platform_says_to_use_a_gpu_or_fsdp(tiny_model_path):
    from rlcore_megatron.engine import MegatronEngine

    with pytest.raises(
        RuntimeError, match=r"megatron engine: megatron-core needs an accelerator.*--engine fsdp"
    ):
        MegatronEngine(EngineSpec(model_path=str(tiny_model_path)), None, get_platform("cpu"), DistInfo())

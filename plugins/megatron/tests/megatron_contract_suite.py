"""rlcore's TrainEngine contract suite against the Megatron engine (one process, TP=PP=DP=1).

Not collected by the normal run (its name does not start with ``test_``): ``test_contract.py`` runs it
in a fresh pytest process, because it installs the test-only CPU redirection of megatron-core's CUDA
calls (:mod:`mcore_cpu_redirect`) process-wide, which must not leak into other plugins' tests.
"""

import mcore_cpu_redirect

mcore_cpu_redirect.install()

import pytest  # noqa: E402
from mcore_testlib import free_port  # noqa: E402
from rlcore.api import DistInfo, EngineSpec  # noqa: E402
from rlcore.devices import get_platform  # noqa: E402
from rlcore.testing.contract import TrainEngineContract  # noqa: E402
from rlcore_megatron.config import MegatronConfig  # noqa: E402
from rlcore_megatron.engine import MegatronEngine  # noqa: E402

PORT = free_port()  # the process group is created once, by the first engine, and shared after


class TestMegatronEngine(TrainEngineContract):
    heads = ("lm", "value", "score")
    # As for the FSDP engine: Adam at 1e-2 overshoots the tiny model's value regression.
    train_lr = 1e-4

    @pytest.fixture
    def make_train_engine(self, tiny_model_path):
        def make(**spec_overrides):
            spec = EngineSpec(model_path=str(tiny_model_path), **spec_overrides)
            return MegatronEngine(spec, MegatronConfig(), get_platform("cpu"), DistInfo(master_port=PORT))

        return make

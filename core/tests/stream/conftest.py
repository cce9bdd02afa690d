import pytest
import torch
from rlcore.testing.tiny import build_tiny_model


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread():
    # A tiny model's forward on a shared 2-core machine is much faster on one thread (see
    # core/tests/rollout/conftest.py).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="package")
def tiny_model(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))

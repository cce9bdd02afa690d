import pytest
import torch
from rlcore.testing.tiny import build_tiny_model


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread():
    # On a shared 2-core machine, torch's two OpenMP threads spin against other processes and a tiny
    # model's forward gets ~25x slower; one thread keeps these tests quick. Restored afterwards.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="package")
def tiny_model(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))

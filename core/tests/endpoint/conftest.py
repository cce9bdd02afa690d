import pytest
import torch


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread():
    # As in the rollout tests: one OpenMP thread keeps the tiny model quick on a shared 2-core machine.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="package")
def tokenizer():
    from rlcore.testing.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()

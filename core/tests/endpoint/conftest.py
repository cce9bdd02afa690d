import pytest
from rlcore.testing.threads import one_torch_thread


@pytest.fixture(scope="package", autouse=True)
def one_thread():
    with one_torch_thread():  # a tiny model on a shared 2-core machine
        yield


@pytest.fixture(scope="package")
def tokenizer():
    from rlcore.testing.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()

import pytest
from rlcore.testing.threads import one_torch_thread
from rlcore.testing.tiny import build_tiny_model


@pytest.fixture(scope="package", autouse=True)
def one_thread():
    with one_torch_thread():  # a tiny model on a shared 2-core machine
        yield


@pytest.fixture(scope="package")
def tiny_model(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))

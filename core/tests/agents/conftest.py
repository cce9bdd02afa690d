import pytest
from rlcore.testing.tiny import build_tiny_tokenizer


@pytest.fixture(scope="package")
def tokenizer():
    return build_tiny_tokenizer()

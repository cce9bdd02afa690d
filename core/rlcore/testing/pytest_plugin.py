"""pytest plugin of rlcore (entry point ``pytest11``), active wherever rlcore is installed.

Gives engine plugins' test suites what :mod:`rlcore.testing.contract` needs: the ``rlcore_contract``
marker and a session-wide ``tiny_model_path`` (a tiny Qwen2 model and tokenizer built locally, no hub).
Cheap to import: torch and transformers load only when a fixture is used.
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "rlcore_contract: a test of rlcore's engine contract suites (rlcore.testing.contract)"
    )


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory):
    """Folder of a random tiny ``Qwen2ForCausalLM`` plus tokenizer (see :mod:`rlcore.testing.tiny`)."""
    from rlcore.testing.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("rlcore-tiny-model"))

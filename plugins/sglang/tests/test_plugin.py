"""Registration and what a machine without SGLang sees: the plugin loads and registers ``sglang`` cheaply,
``rlcore plugins`` says how to get SGLang instead of showing an import error, and building the engine
fails with the same advice."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from rlcore.api import RolloutSpec
from rlcore.plugins import get_plugin_manager, registry
from rlcore_sglang.config import SGLangConfig
from rlcore_sglang.plugin import INSTALL_HINT

RLCORE = Path(sys.executable).with_name("rlcore")
HAS_SGLANG = importlib.util.find_spec("sglang") is not None


def test_registered_lazily_with_its_config_section():
    entry = registry("rollout_engines").entry("sglang")
    assert entry.plugin == "sglang" and entry.options["config"] is SGLangConfig
    assert entry.target == "rlcore_sglang.engine:SGLangRollout" or entry.target.__name__ == "SGLangRollout"
    info = get_plugin_manager().plugins["sglang"]
    assert (info.distribution, info.status, info.registers) == (
        "rlcore-sglang",
        "loaded",
        {"rollout_engines": ["sglang"], "weight_transports": ["sglang-distributed"]},
    )
    transport = registry("weight_transports").entry("sglang-distributed")
    assert transport.target == "rlcore_sglang.transport:SGLangDistributedTransport" or (
        transport.target.__name__ == "SGLangDistributedTransport"  # another test imported it already
    )
    assert info.note == (None if HAS_SGLANG else INSTALL_HINT)


def test_importing_the_entry_point_is_cheap():
    code = (
        "import sys, rlcore_sglang.plugin\n"
        "heavy = [m for m in ('torch', 'sglang', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_rlcore_plugins_lists_sglang_with_its_status():
    assert RLCORE.is_file(), f"the rlcore console script is not installed next to {sys.executable}"
    result = subprocess.run([str(RLCORE), "plugins"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    block = result.stdout.split("sglang (rlcore-sglang 0.1.0): loaded\n", 1)[1].split("\n\n")[0]
    assert block.splitlines()[0].split() == ["rollout", "engines", "sglang"]
    text = " ".join(block.split())
    if HAS_SGLANG:
        assert "note" not in text
    else:
        assert "note sglang is not installed here: install it on a CUDA machine" in text
        assert "Traceback" not in result.stdout and "ModuleNotFoundError" not in result.stdout


def test_building_the_engine_without_sglang_says_what_to_install(tiny_model_path):
    engine_class = registry("rollout_engines").get(
        "sglang"
    )  # the engine module itself imports without sglang
    if HAS_SGLANG:  # a GPU machine: the import succeeds (test_engine_gpu.py builds the engine)
        from rlcore_sglang.engine import import_sglang

        assert import_sglang().__name__ == "sglang"
        return
    with pytest.raises(
        ImportError, match=r"rollout engine 'sglang' \(plugin rlcore-sglang\): sglang is not installed"
    ):
        engine_class(RolloutSpec(model_path=str(tiny_model_path)), SGLangConfig(), None)

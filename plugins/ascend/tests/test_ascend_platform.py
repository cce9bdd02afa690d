"""rlcore-ascend without an Ascend NPU: detection, the hook answers, config names and the listing.

Detection is tested on this machine as it is (no torch_npu) and in a child process that finds a
stand-in ``torch_npu`` package on its path, a *detection* test of "installed, but no NPU": the stand-in
raises if imported, which also proves detection never imports torch_npu. No CANN runtime, NPU or HCCL
is exercised here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from rlcore.config.names import name_error
from rlcore.devices import get_platform
from rlcore_ascend.platform import AscendPlatform


def test_no_torch_npu_here():
    assert not AscendPlatform.is_available()
    assert "torch_npu is not installed" in AscendPlatform.explain()
    assert get_platform("auto").name == "cpu"
    with pytest.raises(RuntimeError, match=r"'ascend' is installed but no device .*rlcore-ascend\[npu\]"):
        get_platform("ascend")


def test_torch_npu_installed_without_an_npu(tmp_path):
    stand_in = tmp_path / "torch_npu"
    stand_in.mkdir()
    (stand_in / "__init__.py").write_text("raise ImportError('detection must not import torch_npu')\n")
    script = textwrap.dedent(
        """
        import json, sys
        from rlcore.devices import detection, get_platform
        from rlcore_ascend.plugin import plugin_status
        rows = {r["name"]: r for r in detection()}
        print(json.dumps({"auto": get_platform("auto").name, "row": rows["ascend"], "status": plugin_status(),
                          "imported": "torch_npu" in sys.modules}))
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env)
    seen = json.loads(out.stdout.splitlines()[-1])
    assert seen["auto"] == "cpu" and not seen["row"]["available"] and not seen["imported"]
    assert "is installed but this machine has no Ascend NPU (/dev/davinci* absent)" in seen["row"]["why"]
    assert seen["status"].startswith("no device: torch_npu")


def test_importing_the_plugin_leaves_torch_npu_alone():
    script = (
        "import sys, rlcore_ascend.plugin as p; p.plugin_status(); "
        "import rlcore_ascend.platform, rlcore_ascend.transport; print('torch_npu' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def ascend() -> AscendPlatform:
    """The platform without its constructor, which imports torch_npu: the hooks read no device state."""
    return object.__new__(AscendPlatform)


def test_facts_and_hooks():
    assert (AscendPlatform.device_type, AscendPlatform.dist_backend) == ("npu", "hccl")
    assert (AscendPlatform.visible_devices_env, AscendPlatform.ray_resource) == (
        "ASCEND_RT_VISIBLE_DEVICES",
        "NPU",
    )
    assert AscendPlatform.ray_visible_devices(["4", "6"]) == {"ASCEND_RT_VISIBLE_DEVICES": "4,6"}
    p = ascend()
    assert p.rollout_env("vllm") == {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    assert p.rollout_env("hf") == {}
    assert p.memory_saver_supported("vllm") and not p.memory_saver_supported("sglang")
    assert not p.ipc_handles_supported()
    assert p.attention_implementation() == "sdpa"


def test_config_names():
    assert name_error("trainer.device", "ascend") is None
    assert name_error("transport.name", "hccl") is None
    assert "Did you mean 'ascend'?" in name_error("trainer.device", "ascnd")


def test_listed_by_rlcore_plugins():
    exe = os.path.join(os.path.dirname(sys.executable), "rlcore")
    out = subprocess.run([exe, "plugins", "--json"], capture_output=True, text=True, check=True).stdout
    plugins = {p["name"]: p for p in json.loads(out)}
    for name, registers in {
        "ascend": {"device_platforms": ["ascend"], "weight_transports": ["hccl"]},
        "rocm": {"device_platforms": ["rocm"]},
    }.items():
        assert plugins[name]["status"] == "no device"  # registered, but auto-detection skips it here
        assert plugins[name]["registers"] == registers
        assert plugins[name]["note"].startswith("no device: ")

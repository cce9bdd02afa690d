"""rlcore-rocm without an AMD GPU: detection, the hook answers, and the plugin's listing.

Detection is tested three ways: on this machine as it is (a CPU build of torch: no HIP), and in child
processes whose torch is made to look like a ROCm build by setting ``torch.version.hip`` (and, for the
AMD-machine case, ``torch.cuda.is_available``/``device_count``) before rlcore looks. Those two are
*detection* tests with faked torch attributes: no HIP runtime, GPU or RCCL is exercised by them.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from rlcore.devices import get_platform
from rlcore_rocm.platform import ROCmPlatform


def run_with_fake_torch(setup: str) -> dict:
    """Run a detection script in a child whose torch attributes ``setup`` altered; return its JSON."""
    script = "\n".join(
        [
            "import json, torch",
            setup,
            "from rlcore.devices import detection, get_platform",
            'rows = {r["name"]: r for r in detection()}',
            'print(json.dumps({"auto": get_platform("auto").name, "rows": rows}))',
        ]
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_not_a_rocm_build_here():
    assert not ROCmPlatform.is_available()
    assert "not a ROCm build" in ROCmPlatform.explain()
    assert get_platform("auto").name == "cpu"
    with pytest.raises(RuntimeError, match=r"'rocm' is installed but no device .*not a ROCm build"):
        get_platform("rocm")


def test_rocm_build_without_a_gpu_is_reported_as_such():
    seen = run_with_fake_torch("torch.version.hip = '6.4.43482'")  # fake: a ROCm build, no GPU
    assert seen["auto"] == "cpu"
    assert not seen["rows"]["rocm"]["available"]
    assert "ROCm build (HIP 6.4.43482) but sees no AMD GPU" in seen["rows"]["rocm"]["why"]
    assert "the rocm platform serves it" in seen["rows"]["cuda"]["why"]


def test_on_an_amd_machine_rocm_outranks_cuda():
    seen = run_with_fake_torch(
        "torch.version.hip = '6.4.43482'\n"  # fake: a ROCm build that sees two GPUs
        "torch.cuda.is_available = lambda: True\n"
        "torch.cuda.device_count = lambda: 2"
    )
    assert seen["auto"] == "rocm"
    assert seen["rows"]["rocm"]["chosen"] and seen["rows"]["rocm"]["available"]
    assert not seen["rows"]["cuda"]["available"]  # the built-in cuda declines a HIP build
    assert seen["rows"]["rocm"]["why"].startswith("2 AMD GPU(s)")


def test_facts():
    assert (ROCmPlatform.device_type, ROCmPlatform.dist_backend) == ("cuda", "nccl")  # HIP, RCCL
    assert (ROCmPlatform.visible_devices_env, ROCmPlatform.ray_resource) == ("HIP_VISIBLE_DEVICES", "GPU")
    assert ROCmPlatform.priority > get_platform("cpu").priority
    from rlcore.plugins import registry

    assert ROCmPlatform.priority > registry("device_platforms").get("cuda").priority


def test_ray_mapping_keeps_hip_and_cuda_equal_and_drops_rocr():
    assert ROCmPlatform.ray_visible_devices(["3", "5"]) == {
        "HIP_VISIBLE_DEVICES": "3,5",
        "CUDA_VISIBLE_DEVICES": "3,5",
        "ROCR_VISIBLE_DEVICES": None,
    }
    assert ROCmPlatform.ray_visible_devices([]) == {}


class OnArch(ROCmPlatform):
    """The ROCm platform on a GPU of architecture ``arch`` (the one device query the hooks make)."""

    def __init__(self, arch: str):
        self.arch = arch

    def gcn_arch(self) -> str:
        return self.arch


def test_memory_saver_follows_vllm_and_sglang_support():
    assert OnArch("gfx942:sramecc+:xnack-").memory_saver_supported("vllm")  # MI300X
    assert OnArch("gfx950").memory_saver_supported("vllm")  # MI350
    assert not OnArch("gfx90a:sramecc+:xnack-").memory_saver_supported("vllm")  # MI250: vLLM has none
    assert OnArch("gfx90a").memory_saver_supported("sglang")
    assert not OnArch("gfx942").memory_saver_supported("hf")


def test_rollout_env_ipc_and_attention():
    rocm = OnArch("gfx942")
    assert rocm.rollout_env("vllm") == {"HIP_FORCE_DEV_KERNARG": "1"} == rocm.rollout_env("sglang")
    assert rocm.rollout_env("hf") == {}
    assert rocm.ipc_handles_supported()
    assert rocm.attention_implementation() == "sdpa"


def test_plugin_status_says_no_device():
    from rlcore_rocm.plugin import plugin_status

    assert plugin_status().startswith("no device: torch ")

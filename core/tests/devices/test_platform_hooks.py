"""The DevicePlatform adapter hooks: their defaults (a platform written before they existed keeps
working), the CPU and CUDA answers in core, Ray's visible-devices mapping, and ``rlcore env``'s report."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from rlcore.api import DevicePlatform
from rlcore.devices import detection, get_platform, ray_device_env

REPO = Path(__file__).resolve().parents[3]


class OldPlatform(DevicePlatform):
    """A third-party platform written against the four abstract methods only."""

    name = "old"
    device_type = "cpu"
    dist_backend = "gloo"

    @classmethod
    def is_available(cls) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def set_device(self, local_rank: int):
        return None

    def memory_stats(self) -> dict[str, float]:
        return {"allocated_gib": 0.0, "reserved_gib": 0.0, "total_gib": 0.0}


def test_hooks_have_defaults_so_older_platforms_keep_working():
    p = OldPlatform()
    assert p.rollout_env("vllm") == {}
    assert p.memory_saver_supported("vllm") is False
    assert p.ipc_handles_supported() is False
    assert p.attention_implementation() == "sdpa"
    assert OldPlatform.explain() == "available"
    assert OldPlatform.ray_visible_devices(["0"]) == {}  # no variable, no Ray resource


def test_cpu_answers():
    cpu = get_platform("cpu")
    assert cpu.rollout_env("vllm") == {}
    assert not cpu.memory_saver_supported("vllm") and not cpu.memory_saver_supported("sglang")
    assert not cpu.ipc_handles_supported()
    assert cpu.attention_implementation() == "sdpa"
    assert type(cpu).ray_visible_devices(["0"]) == {}


def test_cuda_answers_without_a_gpu():
    # The hooks are facts about the platform; none needs a device, so they are checked on a CPU machine.
    from rlcore.plugins import registry

    cuda_cls = registry("device_platforms").get("cuda")
    cuda = object.__new__(cuda_cls)  # no device to construct for; the hooks read no state
    assert cuda.rollout_env("vllm") == {} and cuda.rollout_env("sglang") == {}
    assert cuda.memory_saver_supported("vllm") and cuda.memory_saver_supported("sglang")
    assert cuda.ipc_handles_supported()
    assert cuda.attention_implementation() == "sdpa"
    assert cuda_cls.ray_visible_devices(["2", "3"]) == {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert "CPU build" in cuda_cls.explain()  # torch here is torch+cpu


def test_ray_device_env_named_and_auto():
    assigned = {"GPU": ["1"], "NPU": []}
    assert ray_device_env("cuda", assigned)["CUDA_VISIBLE_DEVICES"] == "1"
    assert ray_device_env("cpu", assigned) == {}
    assert ray_device_env("cuda", {}) == {}  # Ray assigned no GPU: leave the environment alone
    # auto: every platform whose resource Ray assigned contributes; the higher priority wins a clash.
    env = ray_device_env("auto", assigned)
    assert env["CUDA_VISIBLE_DEVICES"] == "1"


def test_detection_lists_every_platform_and_picks_the_first_available():
    rows = detection()
    names = [r["name"] for r in rows]
    assert {"cpu", "cuda", "fake"} <= set(names)
    assert [r["priority"] for r in rows] == sorted((r["priority"] for r in rows), reverse=True)
    (chosen,) = [r for r in rows if r["chosen"]]
    assert chosen["name"] == get_platform("auto").name == "cpu"  # this CPU machine
    assert all(r["why"] for r in rows)


def test_rlcore_env_says_which_platform_and_why():
    exe = Path(sys.executable).with_name("rlcore")
    out = subprocess.run([str(exe), "env"], capture_output=True, text=True, check=True).stdout
    assert "device platforms (highest priority first" in out
    assert re.search(r"^  \* cpu +priority +0 +available", out, re.M)
    assert re.search(r"^    cuda +priority +10 +no device +torch .* CPU build", out, re.M)


def test_no_cuda_literal_outside_the_cuda_and_rocm_platforms():
    """Engines ask the platform; the string "cuda" (or "cuda:N") may be a value only where a platform
    defines it. Scans the syntax trees of core's and the engine plugins' sources, so prose in docstrings
    and comments may still name CUDA. rlcore-sglang is left out while its owner reworks it."""
    allowed = {
        REPO / "core/rlcore/builtin/devices.py",
        REPO / "plugins/rocm/rlcore_rocm/platform.py",
    }
    roots = [REPO / "core/rlcore"] + [
        p for p in (REPO / "plugins").glob("*/rlcore_*") if p.is_dir() and p.parent.name != "sglang"
    ]
    literal = re.compile(r"cuda(:\d+)?")
    offenders = [
        f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}"
        for root in roots
        for path in sorted(root.rglob("*.py"))
        if path not in allowed
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and literal.fullmatch(node.value)
    ]
    assert offenders == []

"""Visible-device mapping under Ray's real resource assignment, in a local Ray cluster on this CPU box.

The cluster declares 2 ``GPU`` and 2 ``NPU`` (Ray takes declared amounts at their word: there is no
device behind them). Each actor takes one device; Ray assigns it an id and sets what its own
accelerator manager sets (on this machine ``CUDA_VISIBLE_DEVICES`` for GPUs, ``ASCEND_RT_VISIBLE_DEVICES``
for NPUs). Inside the actor, :func:`rlcore.devices.apply_ray_device_env` (what every rlcore Ray worker
runs before it chooses its platform) must then give the platform's variables Ray's ids.
"""

from __future__ import annotations

import os

import pytest

ray = pytest.importorskip("ray")  # a dependency of rlcore: never skipped in a real install


@pytest.fixture(scope="module")
def cluster():
    ray.init(
        address="local",
        num_cpus=2,
        num_gpus=2,
        resources={"NPU": 2},
        include_dashboard=False,
        log_to_driver=False,
    )
    yield
    ray.shutdown()


VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")


@ray.remote(num_cpus=0)
class Probe:
    def run(self, device: str) -> dict:
        from rlcore.devices import apply_ray_device_env

        before = {v: os.environ.get(v) for v in VARS}
        applied = apply_ray_device_env(device)
        return {
            "ids": ray.get_runtime_context().get_accelerator_ids(),
            "before": before,
            "applied": applied,
            "after": {v: os.environ.get(v) for v in VARS},
        }


def probe(device: str, **options) -> dict:
    actor = Probe.options(**options).remote()
    try:
        return ray.get(actor.run.remote(device), timeout=120)
    finally:
        ray.kill(actor)


def test_rocm_gets_rays_gpu_ids_in_hip_and_cuda_and_no_rocr(cluster):
    # A node's own ROCR_VISIBLE_DEVICES would renumber beneath Ray's physical ids: the mapping removes it.
    seen = probe("rocm", num_gpus=1, runtime_env={"env_vars": {"ROCR_VISIBLE_DEVICES": "0,1"}})
    (gpu,) = seen["ids"]["GPU"]
    assert seen["before"]["CUDA_VISIBLE_DEVICES"] == gpu  # what Ray set (its NVIDIA manager on this box)
    assert seen["before"]["ROCR_VISIBLE_DEVICES"] == "0,1"
    assert seen["after"]["HIP_VISIBLE_DEVICES"] == seen["after"]["CUDA_VISIBLE_DEVICES"] == gpu
    assert seen["after"]["ROCR_VISIBLE_DEVICES"] is None


def test_auto_lets_every_gpu_platform_map_and_rocm_win(cluster):
    seen = probe("auto", num_gpus=1)
    (gpu,) = seen["ids"]["GPU"]
    assert seen["applied"]["CUDA_VISIBLE_DEVICES"] == seen["applied"]["HIP_VISIBLE_DEVICES"] == gpu
    assert "ASCEND_RT_VISIBLE_DEVICES" not in seen["applied"]  # Ray assigned no NPU


def test_ascend_gets_rays_npu_ids(cluster):
    seen = probe("ascend", resources={"NPU": 1})
    (npu,) = seen["ids"]["NPU"]
    assert seen["before"]["ASCEND_RT_VISIBLE_DEVICES"] == npu  # Ray's NPU manager set it already
    assert seen["applied"] == {"ASCEND_RT_VISIBLE_DEVICES": npu}
    assert seen["after"]["ASCEND_RT_VISIBLE_DEVICES"] == npu
    assert seen["after"]["HIP_VISIBLE_DEVICES"] is None  # no GPU assigned: the GPU platforms stay out


def test_two_actors_get_different_devices(cluster):
    a, b = Probe.options(resources={"NPU": 1}).remote(), Probe.options(resources={"NPU": 1}).remote()
    try:
        seen = ray.get([a.run.remote("auto"), b.run.remote("auto")], timeout=120)
    finally:
        ray.kill(a)
        ray.kill(b)
    ids = {s["after"]["ASCEND_RT_VISIBLE_DEVICES"] for s in seen}
    assert ids == {"0", "1"}

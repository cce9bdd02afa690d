"""Memory-tag bookkeeping: what SGLang is asked to release and resume, driven the way rlcore's
controller drives it (its real ``MemoryPlan`` over a step of colocated RL), and what it refuses."""

import pytest
from rlcore.flows.context import MemoryPlan
from rlcore_sglang.memory import MemoryTags


class RolloutHandle:
    """What MemoryPlan holds for the rollout role: an engine's release/resume, here the plugin's tag
    bookkeeping alone, recording the tags each call would send to SGLang."""

    def __init__(self, tags: MemoryTags):
        self.tags, self.sent = tags, []

    def release(self, tags):
        self.sent.append(("release", self.tags.release(tags)))

    def resume(self, tags):
        self.sent.append(("resume", self.tags.resume(tags)))


class TrainHandle:
    def release(self, tags):
        pass

    def resume(self, tags):
        pass

    def empty_cache(self):  # the plan hands a resident role's cached blocks back before the rollout resumes
        pass


def test_a_colocated_step_releases_and_resumes_each_tag_once():
    tags = MemoryTags(memory_saver=True, weights_backup=False, cuda_graph=True)
    rollout = RolloutHandle(tags)
    plan = MemoryPlan(True, rollout, {"actor": TrainHandle()})
    for _ in range(2):  # two steps: generate, train, sync (weights back, load), check
        plan.use("generate")
        tags.check_generate()
        plan.use("train")
        plan.use("sync")
        tags.check_load()
        with pytest.raises(RuntimeError, match=r"\['kv_cache'\] released"):
            tags.check_generate()
        tags.loaded()
        plan.use("check")
        tags.check_generate()
    assert (
        rollout.sent
        == [
            ("release", ["weights", "kv_cache", "cuda_graph"]),
            ("resume", ["weights"]),
            ("resume", ["kv_cache", "cuda_graph"]),
        ]
        * 2
    )


def test_without_a_host_copy_resumed_weights_must_be_loaded_first():
    tags = MemoryTags(memory_saver=True, weights_backup=False, cuda_graph=False)
    assert tags.release(["weights", "kv_cache"]) == ["weights", "kv_cache"]
    assert tags.resume(["kv_cache", "weights"]) == ["weights", "kv_cache"]
    with pytest.raises(RuntimeError, match="resumed without a host copy.*call load_weights"):
        tags.check_generate()
    tags.loaded()
    tags.check_generate()
    backed = MemoryTags(memory_saver=True, weights_backup=True, cuda_graph=False)
    backed.release(["weights"])
    backed.resume(["weights"])
    backed.check_generate()  # SGLang restored them from its host copy


def test_repeats_and_unknown_tags():
    tags = MemoryTags(memory_saver=True, weights_backup=True, cuda_graph=True)
    assert tags.resume(["weights"]) == []  # nothing released: SGLang would fail an assertion
    assert tags.release(["kv_cache"]) == ["kv_cache", "cuda_graph"]
    assert tags.release(["kv_cache", "weights"]) == ["weights"]  # kv_cache already released
    with pytest.raises(RuntimeError, match="weights are released; call resume"):
        tags.check_load()
    with pytest.raises(ValueError, match=r"unknown memory tags \['kv'\]; valid tags: weights, kv_cache"):
        tags.release(["kv"])
    with pytest.raises(TypeError, match="list of names"):
        tags.release("weights")
    assert tags.released == {"weights", "kv_cache"}


def test_without_the_memory_saver_nothing_is_sent_but_the_rules_hold():
    tags = MemoryTags(memory_saver=False, weights_backup=False, cuda_graph=True)
    assert tags.release(["weights", "kv_cache"]) == []
    with pytest.raises(RuntimeError, match="released"):
        tags.check_generate()
    assert tags.resume(["weights", "kv_cache"]) == []
    tags.check_generate()  # nothing was freed, so the weights are still there

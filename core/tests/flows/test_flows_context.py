"""The step context's services: the colocation memory plan, preset resolution, seeds and group ids."""

from __future__ import annotations

import pytest
from rlcore.algorithms.presets import PRESETS
from rlcore.config.schema import AlgorithmConfig, KLControlConfig, RLConfig, RolloutConfig
from rlcore.flows import resolve_preset
from rlcore.flows.context import MemoryPlan, StepContext
from rlcore.plugins import registry


class Recorder:
    """A role stand-in that logs release/resume calls into a shared list."""

    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def release(self, tags):
        self.log.append((self.name, "release", tuple(tags)))

    def resume(self, tags):
        self.log.append((self.name, "resume", tuple(tags)))

    def empty_cache(self):
        self.log.append((self.name, "empty_cache", ()))


def plan(release_train: bool, enabled: bool = True):
    log: list = []
    roles = {n: Recorder(n, log) for n in ("actor", "critic", "reference")}
    return MemoryPlan(enabled, Recorder("rollout", log), roles, release_train), log


def test_memory_plan_issues_only_transitions_releases_first():
    memory, log = plan(release_train=True)
    memory.use("generate")
    assert log == [
        ("actor", "release", ("grads", "optimizer", "weights")),
        ("critic", "release", ("grads", "optimizer", "weights")),
        ("reference", "release", ("weights",)),
    ]
    log.clear()
    memory.use("generate")
    assert log == []  # no transition, no calls
    memory.use("train")
    assert log == [
        ("rollout", "release", ("kv_cache", "weights")),
        ("actor", "resume", ("grads", "optimizer", "weights")),
        ("critic", "resume", ("grads", "optimizer", "weights")),
        ("reference", "resume", ("weights",)),
    ]
    log.clear()
    memory.use("sync")  # the actor keeps its weights to send; the rollout takes weights, not its cache
    assert log == [
        ("critic", "release", ("grads", "optimizer", "weights")),
        ("reference", "release", ("weights",)),
        ("actor", "empty_cache", ()),  # kept its state: its allocator's cache goes back before the rollout's
        ("rollout", "resume", ("weights",)),
    ]
    log.clear()
    memory.use("check")  # the probe generates (cache back) and the actor scores it (weights stay)
    # (critic and reference hold nothing on the device: no cache to empty)
    assert log == [("actor", "release", ("grads", "optimizer")), ("rollout", "resume", ("kv_cache",))]


def test_memory_plan_never_releases_the_rollout_cache_alone():
    # vLLM's sleep frees weights and KV cache together: releasing "kv_cache" alone would drop the
    # weights a sync is about to load into.
    memory, log = plan(release_train=False)
    memory.use("sync")
    assert log == []
    memory.use("check")
    memory.use("train")
    log.clear()
    memory.use("sync")
    assert log == [
        *[(role, "empty_cache", ()) for role in ("actor", "critic", "reference")],
        ("rollout", "resume", ("weights",)),
    ]


def test_memory_plan_keeps_train_roles_resident_unless_asked():
    memory, log = plan(release_train=False)
    memory.use("generate")
    memory.use("train")
    memory.use("generate")
    assert log == [
        ("rollout", "release", ("kv_cache", "weights")),
        # the train roles keep their state but give their allocators' caches back to the rollout
        *[(role, "empty_cache", ()) for role in ("actor", "critic", "reference")],
        ("rollout", "resume", ("kv_cache", "weights")),
    ]


def test_memory_plan_is_a_no_op_for_split_placement():
    memory, log = plan(release_train=True, enabled=False)
    for state in ("generate", "train", "sync", "check"):
        memory.use(state)
    assert log == []
    with pytest.raises(ValueError, match="unknown memory state"):
        plan(True)[0].use("nap")


def flow(name: str):
    return registry("algorithms").get(name)


def test_presets_resolve_to_themselves_by_default():
    for name in PRESETS:
        assert resolve_preset(AlgorithmConfig(name=name), flow(name)) == PRESETS[name]


def test_user_settings_override_the_preset():
    config = AlgorithmConfig(
        name="dapo", clip_ratio=0.1, use_kl_loss=True, kl_ctrl=KLControlConfig(kl_coef=0.2), gamma=0.99
    )
    preset = resolve_preset(config, flow("dapo"))
    assert (preset.clip_ratio, preset.clip_ratio_low, preset.clip_ratio_high) == (0.1, 0.1, 0.1)
    assert preset.use_kl_loss and preset.needs_reference and preset.roles == ("reference",)
    assert preset.kl_ctrl.kl_coef == 0.2 and preset.gamma == 0.99
    assert preset.filter_groups == PRESETS["dapo"].filter_groups  # untouched fields keep the preset's
    one_sided = AlgorithmConfig(name="grpo", clip_ratio_high=0.3)
    assert resolve_preset(one_sided, flow("grpo")).clip_ratio_low == PRESETS["grpo"].clip_ratio_low


def test_an_estimator_needing_a_critic_on_a_critic_free_flow_says_what_to_do():
    with pytest.raises(ValueError, match="algorithm.name=ppo"):
        resolve_preset(AlgorithmConfig(name="grpo", adv_estimator="gae"), flow("grpo"))


def context(seed: int, step: int) -> StepContext:
    config = RLConfig(rollout=RolloutConfig(n=3, temperature=0.7, max_response_length=5))
    ctx = StepContext(
        config=config,
        preset=None,
        actor=None,
        rollout=None,
        reward=None,
        tokenizer=None,
        pad_token_id=0,
        memory=None,
        transport=None,
        next_prompts=lambda: None,
        seed=seed,
    )
    ctx.begin_step(step)
    return ctx


def test_seeds_and_uids_depend_only_on_seed_step_and_call_order():
    a, b = context(0, 5), context(0, 5)
    assert [a.sampling_seed() for _ in range(3)] == [b.sampling_seed() for _ in range(3)]
    assert context(0, 5).sampling_seed() != context(0, 6).sampling_seed() != context(1, 5).sampling_seed()
    assert context(0, 5).sampling_seed(stream=1) != context(0, 5).sampling_seed()
    uids = a.new_uids(2) + a.new_uids(2)
    assert len(set(uids)) == 4 and all(u.startswith("5.") for u in uids)
    params = context(0, 1).sampling_params(n=1)
    assert (params.n, params.temperature, params.max_tokens, params.logprobs) == (1, 0.7, 5, True)
    assert params.seed is not None


def test_a_step_continued_in_another_context_draws_the_seeds_of_one_context():
    """The overlapping modes generate a step in the rollout thread's context and learn it in the trainer's:
    the learn half's seeds (mini-batch shuffles) must be those a single context would draw after the
    generation's."""
    whole = context(0, 4)
    generation = [whole.sampling_seed() for _ in range(2)]
    learn = [whole.sampling_seed(stream=7) for _ in range(2)]
    producer = context(0, 3).fork()
    producer.begin_step(4)
    assert [producer.sampling_seed() for _ in range(2)] == generation
    trainer = context(0, 1)
    trainer.continue_step(4, producer.counter)
    assert [trainer.sampling_seed(stream=7) for _ in range(2)] == learn
    assert producer.timer is not trainer.timer and producer.metrics is not trainer.metrics


def test_stop_strings_reach_the_sampling_params():
    ctx = context(0, 1)
    ctx.config.rollout.stop = ["</answer>", "\n\n"]
    assert ctx.sampling_params().stop == ("</answer>", "\n\n")

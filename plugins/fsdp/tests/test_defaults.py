"""``fsdp:`` ``auto`` values: the plain settings on CPUs, the throughput path on accelerators while the
memory rule says it fits (rlcore_fsdp.defaults), on the memory of an 80 GB and a 141 GB card."""

import attrs
import pytest
from rlcore.api import EngineSpec
from rlcore.api.device import DevicePlatform
from rlcore.api.memory import ModelShape
from rlcore.builtin.devices import CPUPlatform
from rlcore.config.loader import CONVERTER
from rlcore_fsdp import defaults
from rlcore_fsdp.config import FSDPConfig

GIB = 2**30
H100, H200 = 79.6 * GIB, 139.8 * GIB  # what torch reports as the cards' total memory

# Qwen2.5 shapes from their HF configs (hidden, intermediate, layers, heads, kv heads, vocab, tied).
SHAPES = {
    "0.5B": ModelShape(896, 4864, 24, 14, 2, 151936, True),
    "1.5B": ModelShape(1536, 8960, 28, 12, 2, 151936, True),
    "7B": ModelShape(3584, 18944, 28, 28, 4, 152064, False),
}


class Accelerator(DevicePlatform):
    """A platform that takes the fast path (the rule only asks it that, its name and its attention)."""

    name, device_type, dist_backend = "testgpu", "cpu", "gloo"

    @classmethod
    def is_available(cls) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def set_device(self, local_rank: int):
        raise AssertionError("the rule must not touch a device")

    def memory_stats(self) -> dict[str, float]:
        raise AssertionError("the tests pass device_bytes")


def workload(trainable=True, total_steps=30, tokens="auto", dtype="float32", **more) -> EngineSpec:
    return EngineSpec(
        model_path="unused",
        trainable=trainable,
        dtype=dtype,
        total_steps=total_steps,
        max_tokens_per_micro_batch=tokens,
        max_sequence_length=768,
        **more,
    )


def choose(shape="0.5B", memory=H100, world=1, config=None, spec=None, platform=None):
    return defaults.choose(
        spec or workload(),
        config or FSDPConfig(),
        platform or Accelerator(),
        world,
        device_bytes=memory,
        shape=SHAPES[shape],
    )


def test_cpus_keep_the_plain_settings_and_say_why():
    config, notes = defaults.choose(workload(), FSDPConfig(), CPUPlatform(), 1)
    assert attrs.asdict(config) == attrs.asdict(FSDPConfig(**defaults.PLAIN))
    assert config.mixed_precision is None and config.use_remove_padding is False
    assert config.attn_implementation == "sdpa" and config.logits_chunk_size == 1024
    assert len(notes) == 1 and notes[0].startswith("fsdp auto settings on cpu: mixed_precision=null")
    assert "on CPUs" in notes[0]


@pytest.mark.parametrize("memory", [H100, H200], ids=["80GB", "141GB"])
@pytest.mark.parametrize("shape", ["0.5B", "1.5B"])
def test_small_models_take_the_whole_fast_path_on_one_card(shape, memory):
    config, notes = choose(shape, memory)
    assert config.mixed_precision == "bfloat16"
    assert config.use_remove_padding is True and config.attn_implementation == "varlen"
    assert config.logits_chunk_size == 4096 and config.compile is True
    assert config.recompute_logits is False
    assert config.reshard_after_forward is False and config.reduce_grads_once_per_step is True
    assert "compile on: 30 optimizer steps (>= 20" in "\n".join(notes)


def peak(shape, memory, world, config, spec=None):
    """The rule's estimate for what ``config`` decided, added up here from the shape's own numbers."""
    spec = spec or workload()
    s = SHAPES[shape]
    from rlcore.api.memory import token_budget

    tokens = token_budget(
        s,
        device_bytes=memory,
        dtype="float32",
        gradient_checkpointing=False,
        trainable=spec.trainable,
        shards=world,
        longest=768,
        activation_dtype="bfloat16",
    )
    p = s.parameters()
    used = p * (16 if spec.trainable else 4) / world
    used += tokens * s.activation_bytes_per_token(2, False, backward=spec.trainable)
    used += 3 * config.logits_chunk_size * s.vocab * 4
    if not config.recompute_logits and spec.trainable:
        used += tokens * s.vocab * 2
    if not config.reshard_after_forward:
        used += p * 2 + (p * 4 * (1 - 1 / world) if spec.trainable else 0)
    return used


@pytest.mark.parametrize("memory", [H100, H200], ids=["80GB", "141GB"])
@pytest.mark.parametrize(("shape", "world"), [("0.5B", 1), ("1.5B", 1), ("1.5B", 4), ("7B", 4), ("7B", 8)])
def test_what_is_taken_fits_the_card(shape, world, memory):
    config, _ = choose(shape, memory, world)
    assert peak(shape, memory, world, config) <= defaults.FIT * memory - defaults.RESERVE


def test_a_7b_model_on_four_80gb_cards_keeps_resharding_and_on_141gb_cards_does_not():
    # States 7.6B x 16 B / 4 = 30 GB a rank; the gathered bf16 weights and an unsharded fp32 gradient
    # would add 38 GB more, which an 80 GB card's estimate cannot hold and a 141 GB card's can.
    small, notes = choose("7B", H100, 4)
    assert small.reshard_after_forward is True and small.reduce_grads_once_per_step is False
    assert small.recompute_logits is False  # a micro-batch's kept logits still fit
    assert peak("7B", H100, 4, attrs.evolve(small, reshard_after_forward=False)) > (
        defaults.FIT * H100 - defaults.RESERVE
    )
    large, _ = choose("7B", H200, 4)
    assert large.reshard_after_forward is False and large.reduce_grads_once_per_step is True
    assert "estimated peak" in "\n".join(notes)


def test_a_model_too_large_for_the_card_gets_no_memory_extras():
    config, notes = choose("7B", H100, 1)  # 122 GB of states on an 80 GB card
    assert config.recompute_logits is True and config.reshard_after_forward is True
    assert config.reduce_grads_once_per_step is False
    assert config.compile is True  # costs no memory


def test_compile_waits_for_a_run_long_enough_to_pay_for_it():
    short, notes = choose(spec=workload(total_steps=defaults.COMPILE_MIN_STEPS - 1))
    assert short.compile is False
    assert "compile off: 19 optimizer steps (< 20" in "\n".join(notes)
    assert choose(spec=workload(total_steps=defaults.COMPILE_MIN_STEPS))[0].compile is True


def test_values_the_user_sets_are_kept_and_counted():
    mine = FSDPConfig(compile=False, recompute_logits=True, logits_chunk_size=512, mixed_precision=None)
    config, notes = choose(config=mine)
    assert (config.compile, config.recompute_logits, config.logits_chunk_size) == (False, True, 512)
    assert config.mixed_precision is None
    assert "compile=" not in notes[0] and "recompute_logits=" not in notes[0]
    assert config.use_remove_padding is True  # the rest still decided
    # Explicit memory settings count against the rest: gathered weights that do not fit leave no room.
    kept, _ = choose("7B", H100, 4, config=FSDPConfig(reshard_after_forward=False))
    assert kept.reshard_after_forward is False and kept.reduce_grads_once_per_step is True
    # The memory-lean half chosen keeps the other half lean, though it would fit.
    lean, _ = choose("0.5B", H200, 1, config=FSDPConfig(reshard_after_forward=True))
    assert lean.reduce_grads_once_per_step is False


def test_bf16_parameters_need_no_mixed_precision():
    config, _ = choose(spec=workload(dtype="bfloat16"))
    assert config.mixed_precision is None


def test_a_forward_only_role_keeps_weights_gathered_but_reduces_nothing():
    config, _ = choose(spec=workload(trainable=False))
    assert config.reshard_after_forward is False and config.reduce_grads_once_per_step is False


def test_sliding_window_models_are_not_packed():
    class Sliding:
        sliding_window, use_sliding_window, layer_types = 4096, True, ["sliding_attention", "full_attention"]

    assert defaults._sliding_window(Sliding()) == 4096
    Sliding.use_sliding_window = False
    assert defaults._sliding_window(Sliding()) is None  # Qwen2's configs carry a window they do not use


def test_the_config_parses_switches_and_the_word_auto():
    config = CONVERTER.structure(
        {"compile": True, "logits_chunk_size": 2048, "recompute_logits": "auto"}, FSDPConfig
    )
    assert (config.compile, config.logits_chunk_size, config.recompute_logits) == (True, 2048, "auto")
    with pytest.raises(ValueError, match="fsdp.compile must be true, false or 'auto'"):
        FSDPConfig(compile="yes")
    with pytest.raises(ValueError, match="fsdp.logits_chunk_size must be an integer >= 1 or 'auto'"):
        FSDPConfig(logits_chunk_size=0)


def test_the_run_log_says_what_auto_became(tiny_model_path, capsys):
    """The worker decides before it builds the engine (the engine sees no ``auto``) and prints its lines,
    named by role, once: a local worker's stderr is the driver's, so the driver does not print them again
    (on Ray it echoes rank 0's)."""
    from rlcore.cluster.roles import make_train_role

    spec = EngineSpec(model_path=str(tiny_model_path), total_steps=30)
    role = make_train_role("actor", "fsdp", spec, FSDPConfig(), backend="local", device="cpu")
    try:
        engine = role.group.workers[0].engine
        assert engine.config.compile is False and engine.config.attn_implementation == "sdpa"
        assert not defaults.has_auto(engine.config)
    finally:
        role.shutdown()
    err = capsys.readouterr().err
    assert err.count("rlcore: actor: fsdp auto settings on cpu: mixed_precision=null") == 1, err

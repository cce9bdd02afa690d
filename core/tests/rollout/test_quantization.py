"""``rollout.quantization``: the config, what it changes in the run (off-policy correction, the post-sync
check's bound), and the refusal of an engine that cannot quantize."""

import pytest
from rlcore.api import RolloutEngine, check_quantization
from rlcore.config import ConfigError, load_config
from rlcore.config.specs import check_dtype, off_policy_correction, rollout_spec, sync_check_bound
from rlcore.trainer.preflight import check_run


def _config(*overrides: str, rollout: str = "vllm"):
    return load_config(engine="fsdp", rollout=rollout, overrides=list(overrides))


def test_the_rollout_spec_carries_it_and_other_values_are_refused_by_key():
    assert rollout_spec(_config()).quantization is None
    assert rollout_spec(_config("rollout.quantization=fp8")).quantization == "fp8"
    with pytest.raises(ConfigError, match=r"rollout\.quantization.*int4"):
        _config("rollout.quantization=int4")


def test_auto_correction_is_tis_with_a_quantized_rollout_and_none_without():
    """A synchronous run samples on-policy unless the rollout quantizes: then its samples come from other
    weights than the trainer's, as stale ones do."""
    assert off_policy_correction(_config()) == "none"
    assert off_policy_correction(_config("rollout.quantization=fp8")) == "tis"
    assert off_policy_correction(_config("rollout.quantization=fp8", "algorithm.off_policy=none")) == "none"


def test_the_post_sync_bound_takes_the_fp8_cap_and_margin():
    """fp8 gaps are of another order than bf16's: cap 1.5, margin 0.5 over the measured floor."""
    bf16 = _config("rollout.dtype=bfloat16")
    fp8 = _config("rollout.dtype=bfloat16", "rollout.quantization=fp8")
    assert (check_dtype(bf16), check_dtype(fp8)) == ("bfloat16", "float8")
    assert sync_check_bound(bf16, None) == 0.3 and sync_check_bound(fp8, None) == 1.5
    # min(max(3 * floor, floor + margin), cap)
    assert sync_check_bound(fp8, 0.2) == pytest.approx(0.7)
    assert sync_check_bound(fp8, 0.4) == pytest.approx(1.2)
    assert sync_check_bound(fp8, 0.6) == pytest.approx(1.5)
    assert sync_check_bound(bf16, 0.05) == pytest.approx(0.25)


class _Plain(RolloutEngine):
    pass


class _Fp8(RolloutEngine):
    quantizations = ("fp8",)


def test_an_engine_that_does_not_list_it_is_refused_by_name():
    check_quantization(None, _Plain, "'plain'")
    check_quantization("fp8", _Fp8, "'fp8'")
    with pytest.raises(
        ValueError, match=r"rollout engine 'plain' cannot generate with fp8 weights \(it quantizes nothing\)"
    ):
        check_quantization("fp8", _Plain, "'plain'")


def test_preflight_refuses_fp8_on_the_hf_rollout_before_anything_starts():
    with pytest.raises(
        ConfigError, match=r"'rollout\.quantization': rollout engine 'hf'.*cannot generate with fp8"
    ):
        check_run(_config("rollout.quantization=fp8", rollout="hf"))

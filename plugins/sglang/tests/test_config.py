"""The ``sglang:`` section: defaults, every validator's message (key path and what to do), the
engine_kwargs refusal, and the engine arguments built from it. Runs without sglang."""

import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import torch
from rlcore.api import LoraSpec, RolloutSpec
from rlcore_sglang.config import OWNED_ENGINE_ARGS, SGLangConfig
from rlcore_sglang.engine import engine_args, scheduler_devices

RLCORE = Path(sys.executable).with_name("rlcore")


def rlcore(*args: str) -> subprocess.CompletedProcess:
    assert RLCORE.is_file(), f"the rlcore console script is not installed next to {sys.executable}"
    return subprocess.run([str(RLCORE), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"attention_backend": "flash"}, r"sglang.attention_backend must be one of triton, .*got 'flash'"),
        ({"sampling_backend": "numpy"}, r"sglang.sampling_backend must be one of pytorch, flashinfer"),
        ({"mem_fraction_static": 1.2}, r"sglang.mem_fraction_static must be in \(0, 1\).*got 1.2"),
        ({"mem_fraction_static": 0.0}, r"sglang.mem_fraction_static must be in \(0, 1\)"),
        ({"chunked_prefill_size": 0}, r"sglang.chunked_prefill_size must be a positive token count, -1"),
        ({"chunked_prefill_size": -2}, r"sglang.chunked_prefill_size"),
        ({"logprobs_mode": "raw"}, r"sglang.logprobs_mode must be one of processed_logprobs, raw_logprobs"),
        ({"weight_bucket_mib": 0}, r"sglang.weight_bucket_mib must be >= 1, got 0"),
        ({"mm_attention_backend": "triton"}, r"sglang.mm_attention_backend must be one of sdpa, fa3"),
        (
            {"engine_kwargs": {"mm_attention_backend": "sdpa"}},
            r"mm_attention_backend: sglang.mm_attention_backend",
        ),
        ({"engine_kwargs": {"tp_size": 2}}, r"sglang.engine_kwargs sets \['tp_size'\].*tp_size: rollout"),
        (
            {"engine_kwargs": {"dtype": "float16", "mem_fraction_static": 0.3}},
            r"sets \['dtype', 'mem_fraction_static'\].*dtype: rollout.dtype.*sglang.mem_fraction_static",
        ),
        (
            {"sampling_backend": "flashinfer"},
            r"sglang.sampling_backend=flashinfer cannot honour seeds.*deterministic_inference=false",
        ),
        (
            {"attention_backend": "flashinfer"},
            r"sglang.attention_backend=flashinfer has no deterministic mode.*triton, fa3",
        ),
    ],
)
def test_bad_values_name_the_key(overrides, message):
    with pytest.raises(ValueError, match=message):
        SGLangConfig(**overrides)


def test_values_allowed_without_deterministic_inference():
    config = SGLangConfig(
        deterministic_inference=False, sampling_backend="flashinfer", attention_backend="fa3"
    )
    assert config.sampling_backend == "flashinfer"
    assert SGLangConfig(attention_backend=None, chunked_prefill_size=-1).chunked_prefill_size == -1


def test_every_owned_argument_is_set_by_the_plugin_and_nothing_else_is():
    """OWNED_ENGINE_ARGS is what engine_kwargs may not name; it must be exactly what engine_args sets
    (the optional ones included), or a key would be silently overridden one way or the other."""
    spec = RolloutSpec(
        model_path="/m",
        dtype="bfloat16",
        tensor_parallel_size=2,
        max_model_len=4096,
        lora=LoraSpec(rank=16),
        quantization="fp8",
    )
    config = SGLangConfig(chunked_prefill_size=8192, mem_fraction_static=0.4, attention_backend="fa3")
    args = engine_args(spec, config)
    assert set(args) == OWNED_ENGINE_ARGS
    assert args["enable_lora"] and args["max_lora_rank"] == 16 and args["lora_target_modules"] == ["all"]
    # Merged weights: no room for adapters; no adapter at all: none either.
    assert "enable_lora" not in engine_args(attrs.evolve(spec, lora_sync="merged"), config)
    assert "enable_lora" not in engine_args(attrs.evolve(spec, lora=None), config)
    # FP8 goes through SGLang's loader that quantizes again at every update; without it, SGLang's own.
    assert args["quantization"] == "fp8" and args["load_format"] == "flash_rl"
    assert not {"quantization", "load_format"} & set(
        engine_args(attrs.evolve(spec, quantization=None), config)
    )
    assert args["tp_size"] == 2 and args["context_length"] == 4096 and args["dtype"] == "bfloat16"
    assert args["mem_fraction_static"] == 0.4 and args["sampling_defaults"] == "openai"
    # Null settings leave SGLang's own choice; the memory share falls back to the rollout section.
    defaults = engine_args(spec, SGLangConfig(attention_backend=None, mm_attention_backend=None))
    assert "attention_backend" not in defaults and "chunked_prefill_size" not in defaults
    assert "mm_attention_backend" not in defaults
    # A vision tower's attention runs on triton by default: SGLang's Hopper default (fa3) is not in the
    # GPU bundle.
    assert args["mm_attention_backend"] == "triton_attn"
    assert defaults["mem_fraction_static"] == spec.gpu_memory_utilization


def test_engine_kwargs_pass_through_and_backup_needs_the_saver():
    spec = RolloutSpec(model_path="/m")
    args = engine_args(spec, SGLangConfig(engine_kwargs={"max_running_requests": 64, "log_level": "info"}))
    assert args["max_running_requests"] == 64 and args["log_level"] == "info"
    assert engine_args(spec, SGLangConfig(enable_memory_saver=False))["enable_weights_cpu_backup"] is False


def test_each_tensor_parallel_rank_gets_its_own_device():
    """Where the weight buckets for each SGLang rank must be: rank r on base_gpu_id + r * gpu_id_step."""
    spec = RolloutSpec(model_path="m", tensor_parallel_size=2)
    cuda0 = torch.device("cuda", 0)
    assert scheduler_devices(cuda0, 2, engine_args(spec, SGLangConfig())) == [cuda0, torch.device("cuda", 1)]
    moved = engine_args(spec, SGLangConfig(engine_kwargs={"base_gpu_id": 2, "gpu_id_step": 2}))
    assert scheduler_devices(cuda0, 2, moved) == [torch.device("cuda", 2), torch.device("cuda", 4)]
    assert scheduler_devices(torch.device("cpu"), 2, {}) == [torch.device("cpu")] * 2


def test_every_field_is_documented():
    from rlcore.config.docs import comment_docs

    docs = comment_docs(SGLangConfig)
    missing = [f.name for f in attrs.fields(SGLangConfig) if not docs.get(f.name, ("", ""))[1]]
    assert missing == []


def test_rlcore_config_prints_the_sglang_section():
    result = rlcore("config", "--engine", "megatron", "--rollout", "sglang", "sglang.mem_fraction_static=0.4")
    assert result.returncode == 0, result.stderr
    section = result.stdout.split("\nsglang:\n", 1)[1]
    assert "  attention_backend: triton\n" in section and "  mem_fraction_static: 0.4\n" in section
    assert "\nmegatron:\n" in result.stdout and "engine: sglang" in result.stdout


def test_rlcore_config_rejects_a_bad_value_before_anything_starts():
    result = rlcore("config", "--rollout", "sglang", "sglang.engine_kwargs={model_path: /x}")
    assert result.returncode != 0
    assert "sglang.engine_kwargs sets ['model_path']" in result.stderr and "Traceback" not in result.stderr
    result = rlcore("config", "--rollout", "sglang", "sglang.attention_backnd=fa3")
    assert result.returncode != 0 and "sglang.attention_backend" in result.stderr  # the typo's suggestion


def test_rlcore_train_refuses_sglang_distributed_where_it_cannot_work():
    """NCCL takes no two ranks of a group on one device, and the receiving end is SGLang's scheduler:
    the transport needs split placement and the sglang rollout, said by key path before the run starts."""
    from rlcore.config import ConfigError, load_config
    from rlcore.trainer.preflight import check_run

    check_run(
        load_config(
            overrides=[
                "rollout.engine=sglang",
                "trainer.placement=split",
                "transport.name=sglang-distributed",
            ]
        )
    )
    with pytest.raises(ConfigError) as err:
        check_run(load_config(overrides=["rollout.engine=hf", "transport.name=sglang-distributed"]))
    message = str(err.value)
    assert (
        "'transport.name': weight transport 'sglang-distributed' works with trainer.placement split, not 'colocated'"
        in message
    )
    assert "loads rollout engine sglang, not 'hf'" in message

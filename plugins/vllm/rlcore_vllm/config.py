"""The ``vllm:`` config section."""

import attrs


@attrs.define
class VLLMConfig:
    """Settings specific to the vLLM engine."""

    #: Run the engine core in this process (fast start on CPU) instead of vLLM's separate process.
    in_process: bool = True
    #: Fraction of device memory for weights + KV cache (GPU); CPU uses ``kv_cache_space_gib``.
    gpu_memory_utilization: float = 0.5
    #: KV cache size on CPU, in GiB (vLLM's ``VLLM_CPU_KVCACHE_SPACE``).
    kv_cache_space_gib: int = 1
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    #: Sleep level for ``release`` on GPU (1: offload weights, drop KV; 2: drop both).
    sleep_level: int = 1
    max_num_seqs: int = 256

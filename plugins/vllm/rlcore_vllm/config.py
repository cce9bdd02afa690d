"""The ``vllm:`` config section (light to import: no vllm, no torch).

Engine-independent rollout settings (model path, dtype, tensor parallelism, ``max_model_len``,
``gpu_memory_utilization``, seed) live in :class:`rlcore.api.RolloutSpec`; this section holds what only
vLLM has.
"""

from __future__ import annotations

from typing import Any

import attrs

#: ``max_num_seqs`` on CPUs when the config leaves it null.
CPU_MAX_NUM_SEQS = 256

#: What ``Completion.log_probs`` holds, in vLLM's words (``ModelConfig.logprobs_mode``).
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")

#: Engine arguments this plugin sets itself from the spec and this section; ``engine_kwargs`` may not
#: name them (it would silently override or be overridden).
OWNED_ENGINE_ARGS = frozenset(
    {
        "model",
        "dtype",
        "tensor_parallel_size",
        "max_model_len",
        "gpu_memory_utilization",
        "seed",
        "enforce_eager",
        "enable_prefix_caching",
        "enable_sleep_mode",
        "max_num_seqs",
        "kv_cache_memory_bytes",
        "logprobs_mode",
        "worker_extension_cls",
        "quantization",  # rollout.quantization
        # from actor.lora (rlcore_vllm.adapters)
        "enable_lora",
        "max_loras",
        "max_lora_rank",
    }
)


def _positive(instance: Any, attribute: attrs.Attribute, value: int) -> None:
    if value < 1:
        raise ValueError(f"vllm.{attribute.name} must be >= 1, got {value!r}")


def _sleep_level(instance: Any, attribute: attrs.Attribute, value: int) -> None:
    if value not in (1, 2):
        raise ValueError(
            f"vllm.sleep_level must be 1 (keep a host copy of the weights) or 2 (discard them; a "
            f"load_weights must follow resume), got {value!r}"
        )


def _logprobs_mode(instance: Any, attribute: attrs.Attribute, value: str) -> None:
    if value not in LOGPROBS_MODES:
        raise ValueError(f"vllm.logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, got {value!r}")


#: How a weight load reaches the parameters (``vllm.weight_write``).
WEIGHT_WRITES = ("auto", "direct", "reload")


def _weight_write(instance: Any, attribute: attrs.Attribute, value: str) -> None:
    if value not in WEIGHT_WRITES:
        raise ValueError(f"vllm.weight_write must be one of {', '.join(WEIGHT_WRITES)}, got {value!r}")


#: How seeded ``generate`` calls are seeded (``vllm.seeding``).
SEEDINGS = ("batch", "request")


def _seeding(instance: Any, attribute: attrs.Attribute, value: str) -> None:
    if value not in SEEDINGS:
        raise ValueError(f"vllm.seeding must be one of {', '.join(SEEDINGS)}, got {value!r}")


def _kv_cache_gib(instance: Any, attribute: attrs.Attribute, value: float | None) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"vllm.kv_cache_memory_gib must be positive or null, got {value!r}")


def _engine_kwargs(instance: Any, attribute: attrs.Attribute, value: dict[str, Any]) -> None:
    owned = sorted(OWNED_ENGINE_ARGS & set(value))
    if owned:
        raise ValueError(
            f"vllm.engine_kwargs sets {owned}, which rlcore sets itself; use the rollout section "
            f"(model_path, dtype, quantization, tensor_parallel_size, max_model_len, gpu_memory_utilization, seed) or "
            f"the vllm fields of the same name instead"
        )


@attrs.define(kw_only=True)
class VLLMConfig:
    """Settings specific to the vLLM rollout engine."""

    #: Run vLLM's engine core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): starts in seconds
    #: instead of tens of seconds on CPU and lets weight loads stream straight into the model without
    #: crossing a process boundary. False runs it in vLLM's own process (then the script that builds
    #: the engine needs an ``if __name__ == "__main__":`` guard).
    in_process: bool = True
    #: KV cache size in GiB. Null: on a GPU vLLM takes ``rollout.gpu_memory_utilization`` of the device;
    #: on a CPU rlcore sizes it in bytes for ``max_num_seqs`` sequences of ``rollout.max_model_len``
    #: tokens, capped to half the memory available after the weights (never a fraction of a NUMA node,
    #: which went negative on some machines).
    kv_cache_memory_gib: float | None = attrs.field(default=None, validator=_kv_cache_gib)
    #: Run the model eagerly (no torch.compile, no CUDA graphs): faster start, slower decoding on GPU.
    enforce_eager: bool = False
    #: Reuse KV blocks of shared prompt prefixes (the ``n`` samples of a prompt, multi-turn histories).
    enable_prefix_caching: bool = True
    #: vLLM sleep level used by ``release`` where vLLM supports sleep mode (see ``sleep_mode_supported``):
    #: 1 moves weights to host memory and drops the KV cache; 2 drops both (cheaper when a weight load
    #: follows every resume, as in colocated RL).
    sleep_level: int = attrs.field(default=1, validator=_sleep_level)
    #: Most sequences decoded in one engine step. Null: vLLM's own default on accelerators (1024 on an
    #: H100 for offline use: a GRPO batch of 512 samples decodes in one wave, where 256 took two), and
    #: ``CPU_MAX_NUM_SEQS`` on CPUs, where it also sizes the KV cache.
    max_num_seqs: int | None = attrs.field(default=None, validator=attrs.validators.optional(_positive))
    #: ``processed_logprobs``: log-probs of the sampled token under ``logits / temperature`` (after top-k /
    #: top-p, which renormalise over the kept tokens), what a trainer computes at the same temperature
    #: when neither filter is on. ``raw_logprobs`` (vLLM's default): ``log_softmax(logits)``, ignoring the
    #: temperature, which disagrees with the trainer whenever ``temperature != 1``.
    logprobs_mode: str = attrs.field(default="processed_logprobs", validator=_logprobs_mode)
    #: Debugging switch: drop vLLM's prefix cache after a weight load (one that follows requests: with
    #: none since the last drop nothing is cached from older weights). Turning it off reproduces the
    #: stale-cache bug (prompts longer than one KV block keep generating from the old weights); never
    #: turn it off in a run.
    reset_prefix_cache_after_load: bool = True
    #: How a weight load reaches vLLM's parameters. ``direct``: the stream is copied straight into them
    #: (one multi-tensor copy; see ``rlcore_vllm.direct_write``), for every module vLLM does not process
    #: after loading, and only those go through vLLM's reload; needs an NVIDIA GPU and
    #: ``rollout.tensor_parallel_size: 1``. ``reload``: vLLM's in-place reload for every module (rebuilds
    #: each module: 0.1-0.2 s for 0.5B on an H100; what the CPU build needs, as it repacks weights).
    #: ``auto``: ``direct`` where possible, else ``reload``.
    weight_write: str = attrs.field(default="auto", validator=_weight_write)
    #: How a seeded ``generate`` call (every RL step's) is made reproducible. ``batch``: the engine's
    #: sampling generator is reseeded from the call's seed once nothing else is in flight, and the
    #: call's requests carry no seed of their own: the same prompts with the same seed sample the same
    #: tokens. ``request``: a seed per request (``seed + prompt * n + sample``), so a prompt's samples do
    #: not depend on the rest of the batch, but vLLM samples such requests one at a time with their own
    #: generators (a kernel per request per decoding step). ``agenerate`` (agent episodes, many calls in
    #: flight) always seeds per request.
    seeding: str = attrs.field(default="batch", validator=_seeding)
    #: Further ``vllm.EngineArgs`` passed through unchanged (``max_num_batched_tokens``, ``block_size``,
    #: ``enable_chunked_prefill`` ...); vLLM rejects unknown names.
    engine_kwargs: dict[str, Any] = attrs.field(factory=dict, validator=_engine_kwargs)

"""The ``sglang:`` config section (light to import: no sglang, no torch).

Engine-independent rollout settings (model path, dtype, tensor parallelism, ``max_model_len``,
``gpu_memory_utilization``, seed) live in :class:`rlcore.api.RolloutSpec`; this section holds what only
SGLang has. Every value is checked here, at config time, with its key path: SGLang itself would only
refuse it after spawning its scheduler, tens of seconds into a run.
"""

from __future__ import annotations

from typing import Any

import attrs

#: SGLang's attention backends (``ServerArgs.attention_backend`` choices, SGLang 0.5.16).
ATTENTION_BACKENDS = (
    "triton",
    "torch_native",
    "flex_attention",
    "fa3",
    "fa4",
    "flashinfer",
    "flashmla",
    "cutlass_mla",
    "trtllm_mha",
    "trtllm_mla",
    "cutedsl_mla",
    "tokenspeed_mla",
    "dual_chunk_flash_attn",
    "dsa",
    "dsv4",
    "aiter",
    "wave",
    "intel_amx",
    "ascend",
    "intel_xpu",
)
#: Backends SGLang runs deterministically with its radix (prefix) cache on, which seeded sampling needs.
DETERMINISTIC_ATTENTION_BACKENDS = ("triton", "fa3", "fa4", "ascend")
#: SGLang's attention backends for a vision tower (``ServerArgs.mm_attention_backend``, SGLang 0.5.16).
MM_ATTENTION_BACKENDS = ("sdpa", "fa3", "fa4", "triton_attn", "ascend_attn")
SAMPLING_BACKENDS = ("pytorch", "flashinfer", "ascend")
#: What ``Completion.log_probs`` holds. ``processed_logprobs``: ``log_softmax(logits / temperature)`` of
#: the sampled token (SGLang's default); ``raw_logprobs``: ``log_softmax(logits)``, temperature ignored
#: (SGLang's ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``). Named as ``vllm.logprobs_mode`` names them.
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")

#: ``sglang.Engine`` (``ServerArgs``) arguments this plugin sets itself from the rollout spec and this
#: section; ``engine_kwargs`` may not name them (it would silently override or be overridden).
OWNED_ENGINE_ARGS = frozenset(
    {
        "model_path",
        "tokenizer_path",
        "dtype",
        "tp_size",
        "context_length",
        "mem_fraction_static",
        "random_seed",
        "attention_backend",
        "mm_attention_backend",
        "sampling_backend",
        "chunked_prefill_size",
        "disable_cuda_graph",
        "enable_memory_saver",
        "enable_weights_cpu_backup",
        "enable_deterministic_inference",
        "sampling_defaults",
        "skip_tokenizer_init",
        "enable_lora",
        "max_lora_rank",
        "lora_target_modules",
        "max_loras_per_batch",
        "quantization",
        "load_format",
    }
)
#: Where each owned argument comes from, for the refusal message.
_OWNED_SOURCE = {
    "model_path": "rollout.model_path",
    "tokenizer_path": "rollout.model_path",
    "dtype": "rollout.dtype",
    "tp_size": "rollout.tensor_parallel_size",
    "context_length": "rollout.max_model_len",
    "mem_fraction_static": "sglang.mem_fraction_static",
    "random_seed": "rollout.seed",
    "attention_backend": "sglang.attention_backend",
    "mm_attention_backend": "sglang.mm_attention_backend",
    "sampling_backend": "sglang.sampling_backend",
    "chunked_prefill_size": "sglang.chunked_prefill_size",
    "disable_cuda_graph": "sglang.disable_cuda_graph",
    "enable_memory_saver": "sglang.enable_memory_saver",
    "enable_weights_cpu_backup": "sglang.weights_cpu_backup",
    "enable_deterministic_inference": "sglang.deterministic_inference",
    "sampling_defaults": "(fixed: 'openai', so a checkpoint's generation_config never changes sampling)",
    "skip_tokenizer_init": "(fixed: false, stop strings need the tokenizer)",
    "enable_lora": "actor.lora (with actor.lora.sync auto or adapter)",
    "max_lora_rank": "actor.lora.rank",
    "lora_target_modules": "actor.lora.target_modules",
    "max_loras_per_batch": "(fixed: 1, the adapter being trained)",
    "quantization": "rollout.quantization",
    "load_format": "(fixed: SGLang's default, or 'flash_rl' with rollout.quantization)",
}


def _one_of(choices: tuple[str, ...], *, optional: bool = False):
    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if optional and value is None:
            return
        if value not in choices:
            allowed = ", ".join(choices) + (", or null (SGLang's choice)" if optional else "")
            raise ValueError(f"sglang.{attribute.name} must be one of {allowed}; got {value!r}")

    return check


def _fraction(instance: Any, attribute: attrs.Attribute, value: float | None) -> None:
    if value is not None and not 0 < value < 1:
        raise ValueError(
            f"sglang.{attribute.name} must be in (0, 1) (share of device memory for weights and KV cache) "
            f"or null (use rollout.gpu_memory_utilization), got {value!r}"
        )


def _chunk(instance: Any, attribute: attrs.Attribute, value: int | None) -> None:
    if value is not None and value != -1 and value < 1:
        raise ValueError(
            f"sglang.chunked_prefill_size must be a positive token count, -1 (no chunking) or null "
            f"(SGLang's default for the device), got {value!r}"
        )


def _positive(instance: Any, attribute: attrs.Attribute, value: int) -> None:
    if value < 1:
        raise ValueError(f"sglang.{attribute.name} must be >= 1, got {value!r}")


def _engine_kwargs(instance: Any, attribute: attrs.Attribute, value: dict[str, Any]) -> None:
    if not all(isinstance(key, str) for key in value):
        raise ValueError(f"sglang.engine_kwargs keys must be strings, got {sorted(map(repr, value))}")
    owned = sorted(OWNED_ENGINE_ARGS & set(value))
    if owned:
        where = "; ".join(f"{key}: {_OWNED_SOURCE[key]}" for key in owned)
        raise ValueError(
            f"sglang.engine_kwargs sets {owned}, which rlcore sets itself; set them here instead: {where}"
        )


@attrs.define(kw_only=True)
class SGLangConfig:
    """Settings specific to the SGLang rollout engine (``sglang.Engine``, in this process)."""

    #: SGLang's attention kernels. ``triton`` runs on every CUDA and ROCm GPU, supports deterministic
    #: inference with the prefix cache, and is what rlcore's GPU runs used; ``fa3`` (Hopper) or
    #: ``flashinfer`` may decode faster. Null lets SGLang choose for the device.
    attention_backend: str | None = attrs.field(
        default="triton", validator=_one_of(ATTENTION_BACKENDS, optional=True)
    )
    #: A vision tower's attention kernels (SGLang's ``mm_attention_backend``). ``triton_attn`` runs on every
    #: CUDA GPU; SGLang's own choice on Hopper is ``fa3``, whose kernels the rlcore GPU bundle leaves out
    #: (1.1 GB). Null lets SGLang choose. Text-only models have no vision tower and ignore it.
    mm_attention_backend: str | None = attrs.field(
        default="triton_attn", validator=_one_of(MM_ATTENTION_BACKENDS, optional=True)
    )
    #: SGLang's sampling kernels. ``pytorch`` honours per-request seeds (with ``deterministic_inference``);
    #: ``flashinfer`` does not.
    sampling_backend: str = attrs.field(default="pytorch", validator=_one_of(SAMPLING_BACKENDS))
    #: Share of each device's memory SGLang reserves for weights and KV cache. Null: use
    #: ``rollout.gpu_memory_utilization``.
    mem_fraction_static: float | None = attrs.field(default=None, validator=_fraction)
    #: Longest prompt chunk prefilled in one step (tokens); ``-1`` prefills prompts whole; null keeps
    #: SGLang's default for the device.
    chunked_prefill_size: int | None = attrs.field(default=None, validator=_chunk)
    #: Run decoding without CUDA graphs: faster start and less memory, slower decoding.
    disable_cuda_graph: bool = False
    #: Allocate weights, KV cache and CUDA-graph memory through ``torch_memory_saver``, so that
    #: ``release``/``resume`` free and re-acquire them (colocated placement needs it). Without it they
    #: keep their bookkeeping and free nothing.
    enable_memory_saver: bool = True
    #: Keep a host copy of the weights while they are released (SGLang's ``enable_weights_cpu_backup``),
    #: so ``resume(["weights"])`` restores them. False skips the copy (faster when a weight load follows
    #: every resume, as in colocated RL); ``generate`` then refuses to run until ``load_weights``.
    weights_cpu_backup: bool = True
    #: SGLang's deterministic inference: each request's seed drives its sampling, and kernels give the
    #: same result whatever the batch, so a seed reproduces its samples. Slower decoding. With false,
    #: ``sampling.seed`` is not honoured (SGLang draws from its engine-wide generator) and a warning
    #: says so once.
    deterministic_inference: bool = True
    #: ``processed_logprobs``: log-probs of the sampled token under ``logits / temperature`` (before
    #: top-k / top-p), what a trainer computes at the same temperature. ``raw_logprobs``:
    #: ``log_softmax(logits)``, ignoring the temperature, which disagrees with the trainer whenever
    #: ``temperature != 1``.
    logprobs_mode: str = attrs.field(default="processed_logprobs", validator=_one_of(LOGPROBS_MODES))
    #: Debugging switch: flush SGLang's radix (prefix) cache after every weight load. Turning it off
    #: reproduces the stale-cache bug (prompts seen before the load keep their KV from the old weights);
    #: never turn it off in a run.
    flush_cache_after_load: bool = True
    #: Weight loads are sent to SGLang in flattened buckets of at most this many MiB (one
    #: ``update_weights_from_tensor`` call each; a larger tensor goes alone).
    weight_bucket_mib: int = attrs.field(default=512, validator=_positive)
    #: Further ``sglang.Engine`` (``ServerArgs``) arguments passed through unchanged
    #: (``max_running_requests``, ``disable_radix_cache``, ``log_level`` ...); SGLang rejects unknown names.
    engine_kwargs: dict[str, Any] = attrs.field(factory=dict, validator=_engine_kwargs)

    def __attrs_post_init__(self) -> None:
        if not self.deterministic_inference:
            return
        if self.sampling_backend == "flashinfer":
            raise ValueError(
                "sglang.sampling_backend=flashinfer cannot honour seeds, which "
                "sglang.deterministic_inference=true is for; use sampling_backend=pytorch, or set "
                "deterministic_inference=false"
            )
        if (
            self.attention_backend is not None
            and self.attention_backend not in DETERMINISTIC_ATTENTION_BACKENDS
        ):
            raise ValueError(
                f"sglang.attention_backend={self.attention_backend} has no deterministic mode with the prefix "
                f"cache; with sglang.deterministic_inference=true use one of "
                f"{', '.join(DETERMINISTIC_ATTENTION_BACKENDS)}, or set deterministic_inference=false"
            )

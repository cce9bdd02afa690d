"""What the ``fsdp:`` section's ``auto`` values become on a device, and the memory rule behind them.

On GPUs the engine's plain settings (fp32 compute, padded SDPA, eager layers, logits recomputed, weights
resharded after each forward) ran a 0.5B GRPO step's update at 37k tok/s where the same engine with the
settings below did 101k (docs/benchmarks.md, round 4): users run the defaults, so on a device whose
platform says :meth:`~rlcore.api.DevicePlatform.fast_training` those settings are the defaults:

* ``mixed_precision: bfloat16`` over fp32 parameters (layers compute in bf16, gradients and optimizer in fp32);
* ``use_remove_padding: true`` with ``attn_implementation: varlen`` (no padding, packed var-len attention),
  unless the model uses sliding-window attention, which the var-len backend does not implement;
* ``logits_chunk_size: 4096`` (fewer, larger head chunks);
* ``compile: true`` when the run takes at least :data:`COMPILE_MIN_STEPS` optimizer steps: compiling the
  layers costs 20-60 s once (the first update; more with an empty compile cache), which a short run never
  wins back;
* what costs memory, in the order of what it saves per byte, while the estimate still fits (the rule below):
  ``recompute_logits: false`` (keeps ``tokens x vocab`` logits in the compute dtype instead of a second
  output-layer matmul per token), then ``reshard_after_forward: false`` with
  ``reduce_grads_once_per_step: true`` (one gather and one reduce-scatter per layer and step instead of per
  micro-batch, for the gathered weights and an unsharded fp32 gradient per rank).

Elsewhere (CPUs, the test platform) ``auto`` keeps the plain settings, which are what the CPU rows measured.

**The memory rule.** Per rank, in bytes, with ``P`` parameters, ``S`` ranks sharding them, ``d`` and ``c``
the parameter and compute dtypes' sizes, ``B`` tokens per micro-batch (the role's budget, as
:mod:`rlcore.api.memory` sizes it) and ``V`` the vocabulary:

    states      = P * (d + d + 8) / S         (weights, gradients, AdamW's two fp32 moments; weights alone untrained)
    activations = B * per-token bytes         (rlcore.api.memory's count, its 2x overhead)
    head        = 3 * chunk * V * 4           (a chunk's fp32 logits and its softmax temporaries)
    kept logits = B * V * c                   (recompute_logits: false, trained roles)
    gathered    = P * c + P * 4 * (1 - 1/S)   (reshard_after_forward: false; reduce_grads_once_per_step: true)

and a setting is taken only while ``states + activations + head + what was taken <= FIT * memory - RESERVE``
(:data:`FIT`, :data:`RESERVE`: the CUDA context, the allocator's fragmentation and a colocated rollout's
sleeping remainder). The rollout's own share (``rollout.gpu_memory_utilization``) is not in it: colocated
roles release their device memory to each other by phase. Values the user sets are kept, and counted.
"""

from __future__ import annotations

from typing import Any

import attrs
from rlcore.api import EngineSpec, memory
from rlcore.api.train_engine import AUTO_MICRO_BATCH

AUTO = "auto"
#: Optimizer steps from which compiling the layers pays for itself within the run (see the module doc).
COMPILE_MIN_STEPS = 20
#: The logits chunk on fast-training devices (the CPU keeps the field's plain 1024).
FAST_LOGITS_CHUNK = 4096
PLAIN_LOGITS_CHUNK = 1024
#: Share of the device's memory the estimate may fill, and what is set aside before it.
FIT = 0.9
RESERVE = 2 * 2**30

_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}
_AUTO_FIELDS = (
    "mixed_precision",
    "use_remove_padding",
    "attn_implementation",
    "logits_chunk_size",
    "compile",
    "recompute_logits",
    "reshard_after_forward",
    "reduce_grads_once_per_step",
)
#: What ``auto`` means where the platform does not take the fast path: the engine's plain settings.
PLAIN = {
    "mixed_precision": None,
    "use_remove_padding": False,
    "attn_implementation": "sdpa",
    "logits_chunk_size": PLAIN_LOGITS_CHUNK,
    "compile": False,
    "recompute_logits": True,
    "reshard_after_forward": True,
    "reduce_grads_once_per_step": False,
}


@attrs.frozen
class MemoryEstimate:
    """The rule's terms for one rank, in bytes (see the module doc)."""

    limit: float
    states: float
    activations: float
    head: float
    kept_logits: float
    gathered: float

    def base(self) -> float:
        return self.states + self.activations + self.head


def has_auto(config: Any) -> bool:
    return any(getattr(config, name) == AUTO for name in _AUTO_FIELDS)


def choose(
    spec: EngineSpec,
    config: Any,
    platform: Any,
    world_size: int,
    *,
    device_bytes: float | None = None,
    shape: Any = None,
) -> tuple[Any, list[str]]:
    """``config`` with every ``auto`` field decided for ``spec`` on ``platform``, and the run-log lines
    saying what and why. ``device_bytes`` / ``shape`` (a :class:`~rlcore.api.memory.ModelShape`)
    default to the platform's memory and the model's HF config."""
    if not has_auto(config):
        return config, []
    fast, why = platform.fast_training()
    if not fast:
        chosen = {name: PLAIN[name] for name in _AUTO_FIELDS if getattr(config, name) == AUTO}
        return attrs.evolve(config, **chosen), [
            f"fsdp auto settings on {platform.name}: {_listing(chosen)} ({why})"
        ]
    if device_bytes is None:
        device_bytes = platform.memory_stats()["total_gib"] * 2**30
    hf = None
    if shape is None:
        from transformers import AutoConfig

        hf = AutoConfig.from_pretrained(spec.model_path)
        shape = memory.ModelShape.from_hf_config(hf)
    chosen: dict[str, Any] = {}
    reasons: list[str] = []

    def take(name: str, value: Any) -> Any:
        if getattr(config, name) == AUTO:
            chosen[name] = value
        return getattr(config, name) if getattr(config, name) != AUTO else value

    mixed = take("mixed_precision", "bfloat16" if spec.dtype == "float32" else None)
    sliding = _sliding_window(hf)
    packing = sliding is None and config.attn_implementation in (AUTO, "varlen")
    remove_padding = take("use_remove_padding", packing or config.sequence_parallel_size > 1)
    take("attn_implementation", "varlen" if remove_padding else platform.attention_implementation())
    if sliding is not None and AUTO in (config.use_remove_padding, config.attn_implementation):
        reasons.append(
            f"padded {platform.attention_implementation()}: the model uses sliding-window attention ({sliding})"
        )
    chunk = take("logits_chunk_size", FAST_LOGITS_CHUNK)
    steps = spec.total_steps
    compiled = take("compile", steps >= COMPILE_MIN_STEPS)
    if config.compile == AUTO:
        reasons.append(
            f"compile {'on' if compiled else 'off'}: {steps} optimizer steps "
            f"({'>=' if compiled else '<'} {COMPILE_MIN_STEPS}, where compiling's 20-60 s pays for itself)"
        )

    compute_bytes = _BYTES.get(mixed or spec.dtype, 4)
    estimate = estimate_memory(
        spec,
        shape,
        world_size,
        device_bytes,
        compute_bytes=compute_bytes,
        chunk=chunk,
        micro_tokens=_budget(spec, device_bytes, world_size, mixed or spec.dtype, shape),
    )
    used = estimate.base()
    keep = config.recompute_logits is False or (
        config.recompute_logits == AUTO and used + estimate.kept_logits <= estimate.limit
    )
    take("recompute_logits", not keep)
    if keep and spec.trainable:
        used += estimate.kept_logits
    reshard, reduce_once = config.reshard_after_forward, config.reduce_grads_once_per_step
    if reshard is True or reduce_once is False:  # the user chose the memory-lean side: the pair stays there
        once = False
    elif reshard is False or reduce_once is True:  # the user chose one half of the pair: the other follows
        once = True
    else:
        once = used + estimate.gathered <= estimate.limit
    take("reshard_after_forward", not once)
    take("reduce_grads_once_per_step", once and spec.trainable)
    if once:
        used += estimate.gathered
    gib = 2**30
    reasons.append(
        f"estimated peak {used / gib:.1f} of {estimate.limit / gib:.1f} GiB usable "
        f"({FIT:.0%} of {device_bytes / gib:.0f} GiB less {RESERVE / gib:.0f}): states {estimate.states / gib:.1f}, "
        f"activations {estimate.activations / gib:.1f}, head {estimate.head / gib:.1f}, kept logits "
        f"{estimate.kept_logits / gib:.1f}, gathered weights and gradients {estimate.gathered / gib:.1f}"
    )
    lines = [f"fsdp auto settings on {platform.name} ({why}): {_listing(chosen)}"]
    lines += [f"fsdp auto: {r}" for r in reasons]
    lines.append("fsdp auto: set any of these in the fsdp section to choose it yourself")
    return attrs.evolve(config, **chosen), lines


def estimate_memory(
    spec: EngineSpec,
    shape: Any,
    world_size: int,
    device_bytes: float,
    *,
    compute_bytes: int,
    chunk: int,
    micro_tokens: int,
) -> MemoryEstimate:
    """The memory rule's terms for one rank of ``spec`` (see the module doc)."""
    params = shape.parameters()
    shards = max(1, world_size)
    param_bytes = _BYTES.get(spec.dtype, 4)
    per_param = param_bytes + ((param_bytes + 8) if spec.trainable else 0)
    per_token = shape.activation_bytes_per_token(
        compute_bytes, spec.gradient_checkpointing and spec.trainable, backward=spec.trainable
    )
    return MemoryEstimate(
        limit=FIT * device_bytes - RESERVE,
        states=params * per_param / shards,
        activations=micro_tokens * per_token,
        head=3 * chunk * shape.vocab * 4,
        kept_logits=micro_tokens * shape.vocab * compute_bytes if spec.trainable else 0.0,
        gathered=params * compute_bytes + (params * 4 * (1 - 1 / shards) if spec.trainable else 0.0),
    )


def _budget(spec, device_bytes, world_size, compute_dtype, shape) -> int:
    """Tokens per micro-batch the role will run with (the ``auto`` budget as the worker will size it)."""
    budget = spec.max_tokens_per_micro_batch
    if budget == AUTO_MICRO_BATCH:
        return memory.auto_budget(
            spec, device_bytes=device_bytes, shards=world_size, activation_dtype=compute_dtype, shape=shape
        )
    if budget is None:
        return spec.micro_batch_size * (spec.max_sequence_length or 1)
    return int(budget)


def _sliding_window(hf_config: Any) -> int | None:
    """The sliding window the model attends with in any layer, or None (``use_sliding_window`` and
    ``layer_types`` as Qwen2/Qwen3/Mistral configs spell them)."""
    if hf_config is None:
        return None
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    window = getattr(text, "sliding_window", None)
    if not window:
        return None
    if getattr(text, "use_sliding_window", True) is False:
        return None
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return int(window)


def _listing(chosen: dict[str, Any]) -> str:
    def show(value: Any) -> str:
        return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)

    return ", ".join(f"{name}={show(value)}" for name, value in chosen.items()) or "nothing left to decide"

"""The rollout (generation) engine contract.

A rollout engine turns prompt token ids into sampled responses with their log-probs. It never sees a
train engine: new weights arrive as a stream of ``(hf_name, tensor)`` buckets (:meth:`load_weights`).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import attrs

from rlcore.api.train_engine import WeightBucket


def _at_least_one(instance: Any, attribute: attrs.Attribute, value: int) -> None:
    if value < 1:
        raise ValueError(f"sampling.{attribute.name} must be >= 1, got {value}")


@attrs.define(frozen=True)
class SamplingParams:
    """Sampling settings of one generate call. ``top_k=-1`` and ``top_p=1`` disable those filters;
    ``temperature=0`` is greedy."""

    n: int = attrs.field(default=1, validator=_at_least_one)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = attrs.field(default=128, validator=_at_least_one)
    stop: tuple[str, ...] = ()
    logprobs: bool = True
    seed: int | None = None


@attrs.define
class Completion:
    """One sampled response. ``log_probs[i]`` is the log-prob of ``token_ids[i]`` under the sampling
    distribution (after temperature), ``finish_reason`` is ``"stop"`` or ``"length"``.

    A multi-turn episode (:mod:`rlcore.agents`) is one completion too: ``token_ids`` holds every model
    turn and every tool observation after the prompt, exactly as the engine generated and the episode
    appended them, and ``response_mask[i]`` is 1 where ``token_ids[i]`` was sampled by the model and 0
    on observation tokens (whose ``log_probs`` entries are 0.0 placeholders). ``None``: every token was
    sampled (a single-turn completion). ``info`` carries per-episode facts (turns, tool calls ...).

    ``versions[i]`` is the policy version (the trainer's count of weight syncs) whose weights sampled
    ``token_ids[i]``. Engines leave it ``None``: the controller stamps it, and a response continued
    across a weight update (a partial rollout, :mod:`rlcore.rollout.partial`) holds several versions.
    """

    prompt_ids: list[int]
    token_ids: list[int]
    log_probs: list[float] | None
    finish_reason: str
    text: str = ""
    response_mask: list[int] | None = None
    info: dict[str, Any] | None = None
    versions: list[int] | None = None


@attrs.define
class RolloutSpec:
    """Engine-independent rollout settings (from the ``rollout:`` section)."""

    model_path: str
    dtype: str = "float32"  # must match the trainer's, or post-sync log-probs drift (FINDINGS.md)
    tensor_parallel_size: int = 1
    max_model_len: int = 2048
    gpu_memory_utilization: float = 0.5
    seed: int = 0
    # The policy trains a LoRA adapter (rlcore.api.LoraSpec). An engine that loads adapters
    # (:meth:`RolloutEngine.loads_adapters`) then receives the adapter alone from each sync and generates
    # with it; other engines receive merged weights, as without LoRA.
    lora: Any = None
    # ``actor.lora.sync``: "auto" (the engine decides whether it loads adapters, by its speed with them)
    # or "adapter" (it must).
    lora_sync: str = "auto"
    # ``rollout.quantization``: None (weights in ``dtype``) or ``"fp8"``: the engine quantizes the linear
    # layers' weights to float8 (e4m3) when it loads them and again at every weight load, so the stream
    # stays in ``dtype``. Only engines listing it in :attr:`RolloutEngine.quantizations` take it.
    quantization: str | None = None


class RolloutEngine(abc.ABC):
    """Generation over one model replica (which may itself span ``tensor_parallel_size`` devices)."""

    config_class: ClassVar[type | None] = None
    #: Whether the engine can generate with a LoRA adapter loaded from the weight stream (see
    #: :meth:`load_weights`); when False a LoRA run sends it merged weights.
    supports_lora_adapters: ClassVar[bool] = False
    #: The ``spec.quantization`` values the engine implements (``"fp8"``); a worker refuses the others
    #: before it builds the engine.
    quantizations: ClassVar[tuple[str, ...]] = ()

    def __init__(self, spec: RolloutSpec, config: Any, platform: Any):
        self.spec, self.config, self.platform = spec, config, platform

    @abc.abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Completion]]:
        """Sample ``params.n`` completions per prompt; ``result[i][j]`` is prompt ``i``'s ``j``-th.

        An engine that serves vision-language models also takes ``multi_modal=[{"image": [PIL.Image, ...]}
        or None, ...]``, one entry per prompt (:mod:`rlcore.vision`): such a prompt holds one image token per
        image, as the chat template wrote it, and its completions' ``prompt_ids`` are the prompt with each
        image token expanded to the image's tokens (what the model read, and what a trainer trains on).
        rlcore passes ``multi_modal`` only when a prompt has images, so text-only engines need not take it."""

    @abc.abstractmethod
    async def agenerate(self, prompt: Sequence[int], params: SamplingParams) -> list[Completion]:
        """One request, awaited; many may be in flight at once (multi-turn and agent loops)."""

    @abc.abstractmethod
    def load_weights(self, buckets: Iterable[WeightBucket]) -> None:
        """Load a (possibly partial) weight stream in Hugging Face names, re-sharding for this engine's
        tensor parallelism, then invalidate any cache computed with the old weights (prefix cache).
        An unknown name raises and leaves the engine usable.

        An engine with :attr:`supports_lora_adapters` and ``spec.lora`` set also takes an adapter stream,
        the whole of :meth:`rlcore.api.TrainEngine.export_adapter` (``<module>.lora_A.weight [rank, in]``,
        ``<module>.lora_B.weight [out, rank]``): the adapter replaces the previous one, over the base
        weights the engine started from, for every later request."""

    @abc.abstractmethod
    def release(self, tags: Sequence[str]) -> None:
        """Free device memory held for ``tags`` (``"weights"``, ``"kv_cache"``)."""

    @abc.abstractmethod
    def resume(self, tags: Sequence[str]) -> None:
        """Re-acquire memory released by :meth:`release`."""

    def loads_adapters(self) -> bool:
        """Whether this engine takes the LoRA adapter alone at each sync (else merged weights). Default:
        when it can (:attr:`supports_lora_adapters`) and the run trains one (``spec.lora``). An engine may
        say no under ``lora_sync: auto`` where adapters would make it generate slower than merged weights."""
        return self.supports_lora_adapters and self.spec.lora is not None

    def shutdown(self) -> None:
        """Stop background processes. Default: nothing to stop."""

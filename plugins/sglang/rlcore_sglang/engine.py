"""The SGLang rollout engine: :class:`rlcore.api.RolloutEngine` on ``sglang.Engine`` (in this process).

``sglang.Engine`` runs its tokenizer manager in this process and its scheduler (the model, one process
per tensor-parallel rank) in spawned processes. Everything here talks to the tokenizer manager's
coroutines on one event loop (:mod:`rlcore_sglang.engine_loop`): requests go through a gate, and weight
loads and memory releases run while the gate is closed. Settings that keep rollout log-probs equal to a
trainer's:

- ``dtype`` is the rollout spec's (the trainer's);
- log-probs are SGLang's processed ones, ``log_softmax(logits / temperature)``
  (``sglang.logprobs_mode``), and the checkpoint's generation config never changes sampling
  (``sampling_defaults="openai"``);
- weights are checked against the served model before SGLang sees them, a tied tensor is sent under
  the name SGLang loads it by, and the radix (prefix) cache is flushed after every load (else prompts
  seen before the load reuse KV computed with the old weights);
- a vision-language model gets each prompt's raw images (SGLang's processor, the folder's own, expands
  the image tokens; the completion reports the prompt as SGLang expanded it), its image tokens banned
  from responses as every engine bans them, and no image-embedding cache (SGLang keeps each image's
  encoder output across requests and never drops it at a weight update: a repeated image would read
  the old vision tower).

SGLang's own ``Engine.shutdown`` ends every child process of this process, not only its own: run one
engine per process (a Ray rollout worker is one), or shut it down last.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import itertools
import logging
import os
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from rlcore.adapters import split_stream
from rlcore.api import (
    Completion,
    DevicePlatform,
    RolloutEngine,
    RolloutSpec,
    SamplingParams,
    WeightBucket,
    check_prompts,
    check_sampling,
    request_seeds,
    rollout_dtype,
)
from rlcore.devices import get_platform
from rlcore.vision import VisionInputs, check_multi_modal
from rlcore.vision.inputs import images_of
from rlcore.weights import assemble

from rlcore_sglang import adapters
from rlcore_sglang.config import SGLangConfig
from rlcore_sglang.engine_loop import EngineLoop
from rlcore_sglang.memory import RELEASE_TAGS, MemoryTags
from rlcore_sglang.plugin import INSTALL_HINT
from rlcore_sglang.sampling import to_completion, to_sglang
from rlcore_sglang.weight_stream import ModelWeights, PackedBucket, WeightStreamError, checked_tensors, pack

log = logging.getLogger(__name__)

#: SGLang's switch for ``raw_logprobs``, read by its sampler module when the scheduler process imports it.
RAW_LOGPROB_ENV = "SGLANG_RETURN_ORIGINAL_LOGPROB"
#: NCCL's cuMem switch. SGLang turns it off for its scheduler unless it is set; a trainer process keeps
#: NCCL's default (on), and two ends of one NCCL group that differ here fail their first broadcast with
#: "Cuda failure 'invalid argument'" (measured on 2 x H200: the ``sglang-distributed`` transport). So the
#: scheduler gets NCCL's default too, unless the user set it for every process.
NCCL_CUMEM_ENV = "NCCL_CUMEM_ENABLE"
#: The size of SGLang's image-embedding cache (MiB), read by its scheduler processes at start. It is keyed
#: by the image's content and survives weight updates (SGLang 0.5.16 has no call that drops it), so a
#: vision model's engine starts with it at 0: each request encodes its images with the current weights.
VLM_CACHE_ENV = "SGLANG_VLM_CACHE_SIZE_MB"


#: SGLang's loader for quantized RL rollouts: quantizes at start and again at every weight update (a plain
#: ``quantization="fp8"`` engine quantizes once and replaces the parameters, losing their loaders, so a
#: later update would write 16-bit values into float8 storage).
QUANTIZED_LOAD_FORMAT = "flash_rl"


def import_sglang():
    """``sglang``, or an error saying how to get it (SGLang has no CPU build)."""
    if importlib.util.find_spec("sglang") is None:
        raise ImportError(f"rollout engine 'sglang' (plugin rlcore-sglang): {INSTALL_HINT}")
    import sglang

    return sglang


def engine_args(spec: RolloutSpec, config: SGLangConfig) -> dict[str, Any]:
    """The ``sglang.Engine`` arguments for ``spec`` and ``config`` (``engine_kwargs`` last; it cannot
    name these keys, :data:`rlcore_sglang.config.OWNED_ENGINE_ARGS`)."""
    kwargs: dict[str, Any] = dict(
        model_path=spec.model_path,
        tokenizer_path=spec.model_path,
        dtype=spec.dtype,
        tp_size=spec.tensor_parallel_size,
        context_length=spec.max_model_len,
        mem_fraction_static=(
            config.mem_fraction_static
            if config.mem_fraction_static is not None
            else spec.gpu_memory_utilization
        ),
        random_seed=spec.seed,
        sampling_backend=config.sampling_backend,
        disable_cuda_graph=config.disable_cuda_graph,
        enable_memory_saver=config.enable_memory_saver,
        enable_weights_cpu_backup=config.enable_memory_saver and config.weights_cpu_backup,
        enable_deterministic_inference=config.deterministic_inference,
        sampling_defaults="openai",
        skip_tokenizer_init=False,
    )
    if config.attention_backend is not None:
        kwargs["attention_backend"] = config.attention_backend
    if config.mm_attention_backend is not None:
        kwargs["mm_attention_backend"] = config.mm_attention_backend
    if config.chunked_prefill_size is not None:
        kwargs["chunked_prefill_size"] = config.chunked_prefill_size
    if spec.quantization is not None:
        kwargs.update(quantization=spec.quantization, load_format=QUANTIZED_LOAD_FORMAT)
    if adapters.serves_adapters(spec):
        kwargs.update(adapters.engine_kwargs(spec))
    return {**kwargs, **config.engine_kwargs}


def scheduler_devices(
    device: torch.device, tp_size: int, engine_kwargs: dict[str, Any]
) -> list[torch.device]:
    """The device of each SGLang tensor-parallel rank, numbered as this process numbers them.

    SGLang's scheduler processes inherit this process's visible devices and put rank ``r`` on device
    ``base_gpu_id + r * gpu_id_step`` (0 and 1 unless ``engine_kwargs`` says otherwise). A device
    without an index (the CPU) is every rank's.
    """
    if device.index is None:
        return [device] * tp_size
    base, step = engine_kwargs.get("base_gpu_id", 0), engine_kwargs.get("gpu_id_step", 1)
    return [torch.device(device.type, base + r * step) for r in range(tp_size)]


class SGLangRollout(RolloutEngine):
    """Generation with SGLang over one model replica (``tensor_parallel_size`` devices)."""

    config_class = SGLangConfig
    supports_lora_adapters = True
    #: ``rollout.quantization: fp8``: SGLang's FP8 over a 16-bit checkpoint (``quantization="fp8"``,
    #: per-channel e4m3 weights on Hopper) loaded through its ``flash_rl`` loader, which records each
    #: layer's loaders before quantizing so that every later ``update_weights_from_tensor`` quantizes the
    #: trainer's 16-bit weights again (embeddings, norms and ``lm_head`` stay 16-bit).
    quantizations = ("fp8",)

    def __init__(
        self, spec: RolloutSpec, config: SGLangConfig | None = None, platform: DevicePlatform | None = None
    ):
        config = config if config is not None else SGLangConfig()
        super().__init__(spec, config, platform)
        self.dtype = rollout_dtype(spec.dtype)
        sglang = import_sglang()
        self.weights = ModelWeights.from_pretrained(spec.model_path)
        self.vocab_size = self.weights.layout.shapes[_embedding_name(self.weights)][0]
        self.max_model_len = spec.max_model_len
        # Where weight buckets are packed: this process's accelerator (SGLang's scheduler opens them by
        # CUDA IPC handle), or the CPU.
        self.device = (platform if platform is not None else get_platform("auto")).current_device()
        #: The LoRA adapter requests generate with, when the policy trains one (:mod:`rlcore_sglang.adapters`).
        self.adapter = adapters.AdapterSlot(spec) if adapters.serves_adapters(spec) else None
        #: The folder's processor when the model reads images (SGLang expands their tokens itself).
        self.vision = VisionInputs.for_model(spec.model_path)
        args = engine_args(spec, config)
        with (
            _env(RAW_LOGPROB_ENV, "1" if config.logprobs_mode == "raw_logprobs" else "0"),
            _env(NCCL_CUMEM_ENV, os.environ.get(NCCL_CUMEM_ENV, "1")),
            _env(VLM_CACHE_ENV, "0" if self.vision is not None else os.environ.get(VLM_CACHE_ENV)),
        ):
            self._loop = EngineLoop(lambda: sglang.Engine(**args))
        self._closed = False
        self._ids = itertools.count()
        self._run_id = uuid.uuid4().hex[:8]
        self.memory = MemoryTags(
            memory_saver=config.enable_memory_saver,
            weights_backup=config.weights_cpu_backup,
            cuda_graph=not config.disable_cuda_graph,
        )
        self._rank_devices = scheduler_devices(self.device, spec.tensor_parallel_size, args)
        self._flattened = importlib.util.find_spec("sglang.srt.weight_sync.tensor_bucket") is not None
        self._warned_seed = False

    # -- generation ------------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        multi_modal: Sequence[Mapping | None] | None = None,
    ) -> list[list[Completion]]:
        rows = self._check_request(prompts, params)
        images = self._images(multi_modal, len(rows))
        expanded = [(row, seed, images[i]) for i, row in enumerate(rows) for seed in request_seeds(params, i)]
        future = self._loop.submit(lambda: self._generate(expanded, params, own_ids=False))
        try:
            completions = future.result()
        except BaseException:
            future.cancel()
            raise
        n = params.n
        return [completions[i * n : (i + 1) * n] for i in range(len(rows))]

    async def agenerate(
        self, prompt: Sequence[int], params: SamplingParams, *, multi_modal: Mapping | None = None
    ) -> list[Completion]:
        """One prompt's ``n`` samples, awaited. Many calls may be in flight; SGLang batches them with
        each other and with ``generate`` calls. Cancelling the awaiting task aborts its requests."""
        (row,) = self._check_request([prompt], params)
        (images,) = self._images(None if multi_modal is None else [multi_modal], 1)
        expanded = [(row, seed, images) for seed in request_seeds(params, 0)]
        return await asyncio.wrap_future(
            self._loop.submit(lambda: self._generate(expanded, params, own_ids=True))
        )

    async def _generate(
        self, rows: list[tuple[list[int], int | None, list]], params: SamplingParams, *, own_ids: bool
    ) -> list[Completion]:
        """One batched SGLang request on the engine loop; on cancellation its requests are aborted in
        SGLang (which otherwise keeps decoding them).

        ``own_ids`` (``agenerate``: other calls share the engine): the requests get ids of their own, and
        a cancellation aborts exactly them. SGLang's scheduler aborts every request whose id *starts
        with* the given one, so the ids have a fixed width (none is a prefix of another). Without
        (``generate``'s whole batch): SGLang names the requests, and a cancellation aborts everything the
        engine runs. Explicit ids made SGLang's batches of 256 slower, now and then by a third (plugin
        / raw 0.87 with them, 0.977 without: ``benchmarks/gpu/sglang_rid_probe.py``).
        """
        engine = self._loop.engine
        rids = [f"rlcore-{self._run_id}-{next(self._ids):012d}" for _ in rows] if own_ids else None
        request = dict(
            input_ids=[row for row, _, _ in rows],
            sampling_params=[to_sglang(params, seed, self._banned) for _, seed, _ in rows],
            return_logprob=params.logprobs,
            **({"rid": rids} if own_ids else {}),
            **(self._adapter_request(len(rows))),
        )
        try:
            if any(images for _, _, images in rows):
                outputs = await self._generate_with_images(request, [images for _, _, images in rows])
            else:
                outputs = await engine.async_generate(**request)
        except asyncio.CancelledError:
            if rids is None:
                engine.tokenizer_manager.abort_request(abort_all=True)
            else:
                for rid in rids:
                    engine.tokenizer_manager.abort_request(rid)
            raise
        if isinstance(outputs, dict):  # a batch of one may come back unwrapped
            outputs = [outputs]
        return [
            to_completion(out.get("prompt_token_ids", row), out, want_log_probs=params.logprobs)
            for (row, _, _), out in zip(rows, outputs, strict=True)
        ]

    async def _generate_with_images(self, request: dict[str, Any], images: list[list]) -> list[dict]:
        """``async_generate`` of ``request`` with each row's images (a list per row, empty for none),
        asking for the prompts as SGLang's processor expanded them: the sequences a trainer must read.
        (``Engine.async_generate`` builds the same request but cannot ask for them.)"""
        from sglang.srt.managers.io_struct import GenerateReqInput

        obj = GenerateReqInput(**request, image_data=images, return_prompt_token_ids=True)
        return await self._loop.engine.tokenizer_manager.generate_request(obj, None).__anext__()

    def _images(self, multi_modal: Sequence[Mapping | None] | None, count: int) -> list[list]:
        """Each prompt's images (``[]`` for none), checked (:func:`rlcore.vision.check_multi_modal`)."""
        media = check_multi_modal(multi_modal, count, self.vision, engine="sglang")
        return [images_of(m) for m in media] if media is not None else [[] for _ in range(count)]

    @property
    def _banned(self) -> tuple[int, ...]:
        """Token ids no sample may hold: a vision model's image tokens, whenever it generates (with images
        or without), so every response can be trained on (:attr:`rlcore.vision.VisionInputs.banned_token_ids`)."""
        return self.vision.banned_token_ids if self.vision is not None else ()

    def _adapter_request(self, count: int) -> dict[str, Any]:
        """``async_generate``'s per-request adapter names, once an adapter is loaded (else the base)."""
        if self.adapter is None or self.adapter.name is None:
            return {}
        return {"lora_path": [self.adapter.name] * count}

    def _check_request(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[int]]:
        check_sampling(params)
        self.memory.check_generate()
        if params.seed is not None and not self.config.deterministic_inference and not self._warned_seed:
            self._warned_seed = True
            log.warning(
                "sglang rollout: sampling seeds are not honoured with sglang.deterministic_inference=false "
                "(SGLang then samples from its engine-wide generator); set it to true to reproduce samples"
            )
        return check_prompts(
            prompts, params, vocab_size=self.vocab_size, max_model_len=self.max_model_len, engine="sglang"
        )

    # -- weights ---------------------------------------------------------------------------------
    def load_weights(self, buckets: Iterable[WeightBucket]) -> None:
        """Load a (possibly partial) stream in Hugging Face names; see :mod:`rlcore_sglang.weight_stream`.

        Tensors are checked, packed into flattened buckets of ``sglang.weight_bucket_mib`` on this
        process's device and sent one bucket per ``update_weights_from_tensor`` call; SGLang re-shards
        each for its tensor-parallel ranks. A bad tensor stops the load there with
        :class:`~rlcore_sglang.weight_stream.WeightStreamError` (tensors before it are loaded; the engine
        stays usable). The radix cache is flushed afterwards either way (``flush_cache_after_load``).
        """
        self.memory.check_load()
        split = split_stream(buckets)
        if split is None:
            return
        buckets, is_adapter = split
        if is_adapter:
            self._load_adapter(buckets)
            return
        stream = pack(
            checked_tensors(buckets, self.weights, self.dtype),
            bucket_bytes=self.config.weight_bucket_mib << 20,
            device=self.device,
        )
        self._load((bucket.names, lambda b=bucket: self._send(b)) for bucket in stream)

    def loads_adapters(self) -> bool:
        """See :meth:`rlcore.api.RolloutEngine.loads_adapters` and :func:`rlcore_sglang.adapters.serves_adapters`."""
        return self.adapter is not None

    def _load_adapter(self, buckets: Iterable[WeightBucket]) -> None:
        """An adapter stream (``spec.lora``): it replaces the adapter later requests generate with; the
        radix cache is flushed (its entries hold the old adapter's KV)."""
        if self.adapter is None:
            raise ValueError(
                "sglang rollout: received LoRA adapter tensors, but this engine was built without room for "
                "adapters (RolloutSpec.lora with actor.lora.sync auto or adapter); send merged weights "
                "(actor.lora.sync=merged)"
            )
        name, folder = self.adapter.write((n, t.to(self.dtype)) for n, t in assemble(buckets))
        manager = self._loop.engine.tokenizer_manager
        with self._loop.exclusive():
            self._loop.run(lambda: self.adapter.swap(manager, name, folder))
            if "kv_cache" not in self.memory.released and self.config.flush_cache_after_load:
                self._loop.run(self._flush_cache)

    def join_weight_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str = "nccl",
    ) -> None:
        """Have SGLang's scheduler ranks join a weight group as ranks ``rank_offset .. rank_offset +
        tensor_parallel_size - 1`` (``init_weights_update_group``; rank 0, the sender, hosts the
        rendezvous at ``master_address:master_port``). Blocks until the group is formed. Used by the
        ``sglang-distributed`` transport (:mod:`rlcore_sglang.transport`)."""
        from sglang.srt.managers.io_struct import InitWeightsUpdateGroupReqInput

        request = InitWeightsUpdateGroupReqInput(
            master_address=master_address,
            master_port=master_port,
            rank_offset=rank_offset,
            world_size=world_size,
            group_name=group_name,
            backend=backend,
        )
        manager = self._loop.engine.tokenizer_manager
        success, message = self._loop.run(lambda: manager.init_weights_update_group(request, None))
        if not success:
            raise RuntimeError(f"sglang rollout: SGLang could not join the weight group: {message}")

    def load_weights_from_group(self, headers: Iterable[dict[str, Any]], group_name: str) -> None:
        """Load buckets that the weight group's rank 0 broadcasts: per header (``names``, ``dtypes``,
        ``shapes`` of one flattened bucket, in the order of its bytes) one ``update_weights_from_distributed``
        request, in which SGLang receives the bytes straight into its scheduler ranks. The sender has
        checked the tensors; errors, partial loads and the cache flush behave as in :meth:`load_weights`."""
        from sglang.srt.managers.io_struct import UpdateWeightsFromDistributedReqInput

        self.memory.check_load()
        manager = self._loop.engine.tokenizer_manager

        async def receive(header: dict[str, Any]) -> None:
            request = UpdateWeightsFromDistributedReqInput(
                names=header["names"],
                dtypes=header["dtypes"],
                shapes=header["shapes"],
                group_name=group_name,
                flush_cache=False,  # once after the whole stream, not per bucket
                load_format="flattened_bucket",
            )
            success, message = await manager.update_weights_from_distributed(request, None)
            if not success:
                raise RuntimeError(f"SGLang refused the weight update: {message}")

        self._load((header["names"], lambda h=header: receive(h)) for header in headers)

    def _load(self, steps: Iterable[tuple[list[str], Any]]) -> None:
        """Run each step's coroutine (``make()``, loading ``names``) on the engine loop with requests
        held back; flush the radix cache after whatever was loaded; mark the weights loaded once every
        tensor of the model was. A failing step or stream raises :class:`WeightStreamError` naming what
        was loaded before it."""
        sent: list[str] = []
        with self._loop.exclusive():
            try:
                for names, make in steps:
                    self._loop.run(make)
                    sent.extend(names)
            except WeightStreamError as exc:
                raise WeightStreamError(f"{exc} -- {_loaded_note(sent)}", tuple(sent)) from exc
            except Exception as exc:
                raise WeightStreamError(
                    f"the weight stream failed while being loaded ({type(exc).__name__}: {exc}) -- "
                    f"{_loaded_note(sent)}",
                    tuple(sent),
                ) from exc
            finally:
                if sent and "kv_cache" not in self.memory.released and self.config.flush_cache_after_load:
                    self._loop.run(self._flush_cache)
        if self.weights.targets() <= set(sent):
            self.memory.loaded()

    async def _send(self, bucket: PackedBucket) -> None:
        from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput
        from sglang.srt.utils import MultiprocessingSerializer
        from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions

        # CUDA IPC handles name the device by UUID, so a scheduler whose device numbering differs (its
        # own CUDA_VISIBLE_DEVICES) opens the right one; SGLang's receiving side expects this patch.
        monkey_patch_torch_reductions()
        # Each rank gets the bucket on its own device: a rank that opened another device's memory made a
        # context there and failed its copy ("CUDA error: invalid argument", tp_size=2 on 2 x H200).
        flats = {
            device: bucket.flat if device == bucket.flat.device else bucket.flat.to(device)
            for device in dict.fromkeys(self._rank_devices)
        }
        if self._flattened:
            from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata

            metadata = [
                FlattenedTensorMetadata(
                    name=s.name,
                    shape=torch.Size(s.shape),
                    dtype=s.dtype,
                    start_idx=s.start,
                    end_idx=s.end,
                    numel=s.end - s.start,
                )
                for s in bucket.slots
            ]
            payloads = {
                device: MultiprocessingSerializer.serialize({"flattened_tensor": flat, "metadata": metadata})
                for device, flat in flats.items()
            }
            load_format = "flattened_bucket"
        else:
            from rlcore_sglang.weight_stream import unpack

            payloads = {
                device: MultiprocessingSerializer.serialize(unpack(PackedBucket(flat, bucket.slots)))
                for device, flat in flats.items()
            }
            load_format = None
        request = UpdateWeightsFromTensorReqInput(
            serialized_named_tensors=[payloads[device] for device in self._rank_devices],
            load_format=load_format,
            flush_cache=False,  # once after the whole stream, not per bucket
        )
        success, message = await self._loop.engine.tokenizer_manager.update_weights_from_tensor(request, None)
        if not success:
            raise RuntimeError(f"SGLang refused the weight update: {message}")

    async def _flush_cache(self) -> None:
        result = await self._loop.engine.tokenizer_manager.flush_cache()
        if not getattr(result, "success", True):
            raise RuntimeError(
                f"sglang rollout: SGLang refused to flush its radix cache after a weight load "
                f"({getattr(result, 'message', '')}); requests still running?"
            )

    # -- memory ----------------------------------------------------------------------------------
    def release(self, tags: Sequence[str]) -> None:
        """Free device memory by tag through SGLang's ``release_memory_occupation`` (weights, KV cache,
        and CUDA-graph buffers with the KV cache), once in-flight requests have finished. A logged
        no-op without ``sglang.enable_memory_saver``, with the same bookkeeping."""
        if not self.memory.sends:
            log.info("sglang rollout: sglang.enable_memory_saver is off; release(%s) frees nothing", tags)
        sglang_tags = self.memory.release(tags)
        if sglang_tags:
            self._memory_call("ReleaseMemoryOccupationReqInput", "release_memory_occupation", sglang_tags)

    def resume(self, tags: Sequence[str]) -> None:
        """Re-acquire released memory by tag: ``["weights"]`` first lets a weight load run before the KV
        cache comes back. Without a host copy of the weights (``sglang.weights_cpu_backup: false``) a
        weight load must follow before the engine generates."""
        sglang_tags = self.memory.resume(tags)
        if sglang_tags:
            self._memory_call("ResumeMemoryOccupationReqInput", "resume_memory_occupation", sglang_tags)

    def _memory_call(self, request: str, method: str, tags: list[str]) -> None:
        from sglang.srt.managers import io_struct

        obj = getattr(io_struct, request)(tags=tags)
        with self._loop.exclusive() as engine:
            self._loop.run(lambda: getattr(engine.tokenizer_manager, method)(obj, None))

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[Any]:
        """The underlying ``sglang.Engine``, for direct use while no rlcore request runs (a raw
        ``async_generate`` to compare against, ``get_weights_by_name``): call its coroutines with
        :meth:`run_on_engine_loop`; its synchronous methods would need the loop this engine runs."""
        with self._loop.exclusive() as engine:
            yield engine

    def run_on_engine_loop(self, make):
        """Run the coroutine ``make()`` on the engine's event loop and return its result."""
        return self._loop.run(make)

    def shutdown(self) -> None:
        """Stop the engine loop and SGLang's processes. Idempotent."""
        if self._closed:
            return
        self._closed = True
        engine = self._loop.engine
        self._loop.close()
        engine.shutdown()
        if self.adapter is not None:
            self.adapter.close()


def _embedding_name(weights: ModelWeights) -> str:
    """The input embedding's name (its first dimension is the vocabulary the engine accepts)."""
    names = [n for n in weights.layout.shapes if n.endswith("embed_tokens.weight")]
    if not names:
        raise ValueError(
            f"sglang rollout: found no '*embed_tokens.weight' in {weights.layout.model_path}; "
            f"rlcore-sglang serves causal LMs in Hugging Face layout"
        )
    return names[0]


def _loaded_note(sent: list[str]) -> str:
    if not sent:
        return "nothing was loaded"
    return (
        f"{len(sent)} tensors before it were loaded (every other weight keeps its old value; send a "
        f"complete stream to make the model consistent again)"
    )


@contextlib.contextmanager
def _env(key: str, value: str | None) -> Iterator[None]:
    """Set ``key`` (unset for None) while SGLang spawns its scheduler processes (they read it at import)."""
    previous = os.environ.get(key)
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = previous


#: rlcore's memory tags, re-exported for callers that name them.
__all__ = ["RELEASE_TAGS", "SGLangRollout", "engine_args", "import_sglang"]

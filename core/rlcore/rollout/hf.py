"""The reference rollout: a Hugging Face ``transformers`` model on one device.

Slow next to vLLM or SGLang, but simple enough to trust: other rollout engines and the post-sync check
are measured against it, and it runs anywhere transformers does.

Two decode paths (``hf.decode``). ``loop`` (the default): rlcore's own loop over the model's forward: one
prefill per distinct prompt of a chunk, then one token per step into a KV cache allocated once for the
prompt plus ``max_tokens`` (:class:`_PreallocatedLayer`), tokens drawn by inverse CDF (:func:`_sample`:
one uniform per row, exact for the categorical distribution) from a ``torch.Generator`` of the call.
``generate``: ``model.generate`` with a log-prob recording processor, whose cache and masks grow by
concatenation and whose sampler (``torch.multinomial``) draws a random number per vocabulary entry. Both
sample the same distribution and record the same log-probs; on the tiny CPU model of
``benchmarks/hf_decode.py`` the loop takes about 0.6x the time of ``generate``.

Images (a vision-language model folder, :mod:`rlcore.vision`): a vision model decodes by ``generate``
whatever ``hf.decode`` says, because its rotary positions are the model's own 3-D ones (M-RoPE), which
rlcore's loop does not compute, and its image tokens are never sampled. Each prompt's image tokens are
expanded by the folder's processor, and ``Completion.prompt_ids`` is the expanded prompt.

Log-probs. ``Completion.log_probs[i]`` is ``log_softmax(logits / temperature)`` of the sampled token,
computed in float32 from the raw logits *before* top-k / top-p filtering: exactly what a train engine
computes from a forward pass over prompt + response (``EngineSpec.temperature``), so the two agree up to
numerics. Greedy (``temperature == 0``) reports ``log_softmax(logits)``.

Sampling is only what :class:`~rlcore.api.SamplingParams` says: the checkpoint's
``generation_config.json`` contributes its eos ids and nothing else (no hidden repetition penalty or
top-k). Each call is seeded (``params.seed``, or the next draw from a stream seeded by
``RolloutSpec.seed``) without touching the process's global RNG.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import functools
import random
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
from transformers import (
    AutoTokenizer,
    DynamicCache,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.cache_utils import DynamicLayer

from rlcore.api import (
    Completion,
    DevicePlatform,
    RolloutEngine,
    RolloutSpec,
    SamplingParams,
    WeightBucket,
    check_prompts,
    check_sampling,
    check_tags,
    rollout_dtype,
)
from rlcore.rollout.config import HFRolloutConfig
from rlcore.rollout.stopping import StopStrings, finish_response
from rlcore.vision.inputs import BANNED_LOGIT, VisionInputs, check_multi_modal, model_class
from rlcore.weights import CheckpointFormat, assemble


class WeightLoadError(ValueError):
    """A weight stream did not fit the model; nothing of it was applied."""


class HFRollout(RolloutEngine):
    """Generation over left-padded chunks of ``config.batch_size`` sequences, by rlcore's decode loop or
    ``model.generate`` (``config.decode``)."""

    config_class = HFRolloutConfig

    def __init__(self, spec: RolloutSpec, config: HFRolloutConfig | None, platform: DevicePlatform):
        config = config if config is not None else HFRolloutConfig()
        super().__init__(spec, config, platform)
        dtype = rollout_dtype(spec.dtype)
        self.device = platform.current_device()  # set_device ran earlier, or device 0
        self.tokenizer = AutoTokenizer.from_pretrained(spec.model_path)
        kwargs = {
            "dtype": dtype,
            "attn_implementation": config.attn_implementation or platform.attention_implementation(),
        }
        model_cls = model_class(spec.model_path)
        self.model = model_cls.from_pretrained(spec.model_path, **kwargs).to(self.device).eval()
        #: The folder's processor when the model reads images (else None).
        self.vision = VisionInputs.for_model(spec.model_path)
        self.eos_ids = _eos_ids(self.model.generation_config, self.tokenizer)
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.eos_ids[0]
        # A neutral generation config: generate() fills unset fields from the model's, and a checkpoint's
        # sampling defaults (top_k=20, repetition_penalty=1.05 ...) must not leak into the rollout.
        self.model.generation_config = GenerationConfig(
            eos_token_id=self.eos_ids, pad_token_id=self.pad_id, bos_token_id=self.tokenizer.bos_token_id
        )
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        #: The weight stream's names and layouts (the checkpoint's) against the model's in memory.
        self._checkpoint = CheckpointFormat(self.model)
        self._seeds = random.Random(spec.seed)
        self._lock = threading.Lock()  # one generate/load at a time: the model and RNG are shared
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-rollout")
        self._released: set[str] = set()

    # -- generation ------------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        multi_modal: Sequence[Mapping | None] | None = None,
    ) -> list[list[Completion]]:
        check_sampling(params)
        media = check_multi_modal(multi_modal, len(prompts), self.vision, engine="hf")
        images = None  # each prompt's image inputs (None for a prompt without images)
        if media is not None:
            prompts, images = zip(
                *(self.vision.prompt_inputs(p, m) for p, m in zip(prompts, media, strict=True)), strict=True
            )
        checked = check_prompts(
            prompts, params, vocab_size=self.vocab_size, max_model_len=self.spec.max_model_len, engine="hf"
        )
        rows = [p for p in checked for _ in range(params.n)]
        row_media = None if images is None else [m for m in images for _ in range(params.n)]
        with self._lock:
            if "weights" in self._released:
                raise RuntimeError(
                    "hf rollout: weights are released; call resume(['weights']) before generate"
                )
            seed = params.seed if params.seed is not None else self._seeds.randrange(2**63)
            out: list[Completion] = []
            # A vision model decodes by generate, with or without images: its positions are its own
            # (M-RoPE) and its image tokens are never sampled.
            if self.config.decode == "loop" and self.vision is None:
                # The loop draws from its own generator: the process's RNG is never touched.
                rng = torch.Generator(device=self.device).manual_seed(seed)
                seeded = contextlib.nullcontext()
            else:
                rng, seeded = None, self._seeded(seed)
            with seeded, torch.inference_mode():
                for start in range(0, len(rows), self.config.batch_size):
                    chunk = rows[start : start + self.config.batch_size]
                    chunk_media = (
                        None if row_media is None else row_media[start : start + self.config.batch_size]
                    )
                    out.extend(self._generate_chunk(chunk, params, rng, chunk_media))
        n = params.n
        return [out[i * n : (i + 1) * n] for i in range(len(prompts))]

    async def agenerate(
        self, prompt: Sequence[int], params: SamplingParams, *, multi_modal: Mapping | None = None
    ) -> list[Completion]:
        loop = asyncio.get_running_loop()
        media = None if multi_modal is None else [multi_modal]
        call = functools.partial(self.generate, [prompt], params, multi_modal=media)
        result = await loop.run_in_executor(self._executor, call)
        return result[0]

    def _generate_chunk(
        self,
        rows: list[list[int]],
        params: SamplingParams,
        generator: torch.Generator | None,
        media: list[dict | None] | None = None,
    ) -> list[Completion]:
        """Sample one chunk. Rows are left-padded to a common width ``W``; both decode paths derive position
        ids from the attention mask, so each row sees the positions it would see alone (the model's own
        M-RoPE positions with ``media``, the rows' image inputs, through ``generate``)."""
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            input_ids[i, width - len(row) :] = torch.tensor(row)
            attention_mask[i, width - len(row) :] = 1
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        if self.vision is not None:
            pixels = self.vision.batch_inputs(input_ids, media) if media is not None else {}
            pixels = {k: v.to(self.device) for k, v in pixels.items()}
            generated, log_probs = self._hf_generate(
                input_ids, attention_mask, params, pixels, banned=self.vision.banned_token_ids
            )
        elif generator is None:
            generated, log_probs = self._hf_generate(input_ids, attention_mask, params)
        else:
            generated, log_probs = self._decode_loop(input_ids, attention_mask, params, generator)
        log_probs = log_probs.tolist()
        completions = []
        for i, (row, tokens) in enumerate(zip(rows, generated.tolist(), strict=True)):
            end = finish_response(
                tokens,
                log_probs[i],
                eos_ids=self.eos_ids,
                stop=params.stop,
                decode=self._decode,
                max_len=params.max_tokens,
            )
            completions.append(
                Completion(
                    prompt_ids=list(row),
                    token_ids=end.token_ids,
                    log_probs=end.log_probs if params.logprobs else None,
                    finish_reason=end.finish_reason,
                    text=end.text,
                )
            )
        return completions

    def _hf_generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        params: SamplingParams,
        extra: Mapping[str, torch.Tensor] | None = None,
        banned: Sequence[int] = (),
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``decode: generate``: ``model.generate`` with a log-prob recording processor. Returns the generated
        tokens ``[b, T]`` (rows that ended early run on with padding) and their log-probs, on the CPU.
        ``extra``: the model's image inputs (``pixel_values``, ``image_grid_thw``, ``mm_token_type_ids``);
        ``banned``: token ids whose logits get :data:`~rlcore.vision.inputs.BANNED_LOGIT` (a vision model's
        image tokens), before the recorder."""
        width = input_ids.shape[1]
        greedy = params.temperature == 0
        recorder = _LogProbRecorder(1.0 if greedy else params.temperature)
        # The bias comes first, so the recorded log-probs are of the distribution the tokens come from.
        processors = LogitsProcessorList([_LogitBias(banned), recorder] if banned else [recorder])
        if not greedy:
            # HF's own warpers are switched off (temperature 1, top_k 0, top_p 1 below) and re-added after
            # the recorder, which must see the raw logits.
            if params.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(params.temperature))
            processors.extend(_filters(params))
        gen_config = GenerationConfig(
            max_new_tokens=params.max_tokens,  # check_prompts made sure it fits max_model_len
            do_sample=not greedy,
            num_beams=1,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            **({} if greedy else {"temperature": 1.0, "top_k": 0, "top_p": 1.0}),
        )
        stopping = StoppingCriteriaList(
            [StopStrings(params.stop, self._decode, width)] if params.stop else []
        )
        sequences = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=gen_config,
            logits_processor=processors,
            stopping_criteria=stopping,
            **(extra or {}),
        )
        generated = sequences[:, width:]
        return generated.cpu(), recorder.result(generated)

    def _decode_loop(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``decode: loop``: one prefill, then one forward per token; the KV cache does not grow by copying.

        Same contract as :meth:`_hf_generate`. Full-attention layers of the cache are
        :class:`_PreallocatedLayer` (one buffer of ``W + max_tokens`` positions, written in place), where
        ``generate`` concatenates every step; the attention mask is one ``[b, W + max_tokens]`` tensor
        passed as growing views. Each distinct prompt is prefilled once (:meth:`_prefill`). Tokens are
        drawn by :func:`_sample` from ``generator``. Rows that ended emit the pad token until all have
        ended; then the loop stops.
        """
        batch, width = input_ids.shape
        max_tokens = params.max_tokens
        device = input_ids.device
        cache = _preallocated_cache(self.model.config, width + max_tokens)
        # Generated slots are real tokens; the mask passed at each step covers the prompt and the tokens so far.
        mask = torch.ones((batch, width + max_tokens), dtype=torch.bool, device=device)
        mask[:, :width] = attention_mask.bool()
        positions = (attention_mask.cumsum(-1) - 1).clamp_(min=0)  # [b, W]; pads get 0, never attended
        next_position = positions[:, -1:] + 1  # [b, 1]: the prompt's length (the last column is real)
        tokens = torch.full((batch, max_tokens), self.pad_id, dtype=torch.long, device=device)
        log_probs = torch.zeros((batch, max_tokens), dtype=torch.float32, device=device)
        unfinished = torch.ones(batch, dtype=torch.bool, device=device)
        eos = torch.tensor(self.eos_ids, device=device)
        filters = _filters(params)
        stop = StopStrings(params.stop, self._decode, 0) if params.stop else None
        logits = self._prefill(input_ids, mask[:, :width], positions, cache)
        steps = 0
        for step in range(max_tokens):
            token, log_prob = _sample(
                logits[:, -1, :].float(), params.temperature, filters, generator, params.logprobs
            )
            token = torch.where(unfinished, token, self.pad_id)
            tokens[:, step] = token
            if log_prob is not None:
                log_probs[:, step] = log_prob
            steps = step + 1
            unfinished &= ~torch.isin(token, eos)
            if stop is not None:
                unfinished &= ~stop(tokens[:, :steps], None)
            if steps == max_tokens or not bool(unfinished.any()):
                break
            logits = self.model(
                input_ids=token[:, None],
                attention_mask=mask[:, : width + steps],
                position_ids=next_position + step,
                past_key_values=cache,
                use_cache=True,
            ).logits
        return tokens[:, :steps].cpu(), log_probs[:, :steps].cpu()

    def _prefill(
        self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        """Logits ``[b, 1, V]`` at the prompts' last position, their keys and values written into ``cache``.

        A prompt that fills several rows (``n`` samples) runs once: the distinct rows run into a plain
        cache, and their keys, values and logits are copied to every row holding the same prompt. (Where
        a cache layer is not a :class:`_PreallocatedLayer`, or all rows differ, every row runs.)
        """
        first: dict[tuple, int] = {}  # (ids, mask) of a row -> its index among the distinct rows
        distinct_rows, inverse = [], []
        for row, key in enumerate(
            zip(map(tuple, input_ids.tolist()), map(tuple, mask.tolist()), strict=True)
        ):
            if key not in first:
                first[key] = len(distinct_rows)
                distinct_rows.append(row)
            inverse.append(first[key])
        forward = {"use_cache": True, "logits_to_keep": 1}
        if len(distinct_rows) == len(inverse) or not all(
            isinstance(x, _PreallocatedLayer) for x in cache.layers
        ):
            return self.model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                **forward,
            ).logits
        unique = torch.tensor(distinct_rows, device=input_ids.device)
        inverse = torch.tensor(inverse, device=input_ids.device)
        distinct = DynamicCache(config=self.model.config)
        logits = self.model(
            input_ids=input_ids[unique],
            attention_mask=mask[unique],
            position_ids=positions[unique],
            past_key_values=distinct,
            **forward,
        ).logits
        for layer, filled in zip(cache.layers, distinct.layers, strict=True):
            layer.update(filled.keys[inverse], filled.values[inverse])
        return logits[inverse]

    def _decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    @contextlib.contextmanager
    def _seeded(self, seed: int) -> Iterator[None]:
        """Seed this device's RNG for one call and restore the caller's RNG state afterwards."""
        if self.device.type == "cpu":
            with torch.random.fork_rng(devices=[]):
                torch.default_generator.manual_seed(seed)
                yield
            return
        module = torch.get_device_module(self.device.type)
        with torch.random.fork_rng(devices=[self.device.index], device_type=self.device.type):
            torch.default_generator.manual_seed(seed)
            module.manual_seed(seed)
            yield

    # -- weights ---------------------------------------------------------------------------------
    def load_weights(self, buckets: Iterable[WeightBucket]) -> None:
        """Load a (possibly partial) stream in Hugging Face names; all or nothing.

        Every tensor is checked (name, shape) and held until the stream ends, then copied (cast to the
        model's dtype and device) into the parameters, so a bad name, shape or an incomplete stream
        leaves the model as it was. Holding costs one copy of the streamed weights in the transport's
        memory. Tied parameters (``lm_head.weight`` and ``model.embed_tokens.weight`` when
        ``tie_word_embeddings``) may arrive under either name or both (then they must be equal). Names
        and layouts are the checkpoint's: a mixture of experts' experts arrive one by one and are copied
        into the model's fused expert tensors (:class:`rlcore.weights.CheckpointFormat`).
        """
        state = self.model.state_dict()
        shapes = self._checkpoint.shapes
        staged: dict[str, torch.Tensor] = {}
        try:
            for name, tensor in assemble(buckets):
                shape = shapes.get(name)
                if shape is None:
                    raise WeightLoadError(self._unknown_name_message(name, shapes))
                if tuple(tensor.shape) != shape:
                    raise WeightLoadError(
                        f"weight stream sent {name!r} with shape {tuple(tensor.shape)}, but the rollout model "
                        f"({self.spec.model_path}) has shape {shape}; nothing was loaded. Do the "
                        f"trainer and rollout load the same architecture?"
                    )
                if name in staged:
                    raise WeightLoadError(f"weight stream sent {name!r} twice; nothing was loaded")
                staged[name] = tensor
        finally:
            # A transport streaming through a collective drains what is left when its iterator closes,
            # so the sender is not left blocked when this load fails part way.
            close = getattr(buckets, "close", None)
            if close is not None:
                close()
        _check_tied(staged, state)
        with self._lock, torch.no_grad():
            self._checkpoint.copy_into(state, staged)

    def _unknown_name_message(self, name: str, shapes: Mapping[str, tuple[int, ...]]) -> str:
        valid = list(shapes)
        close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6) or valid[:3]
        return (
            f"weight stream sent {name!r}, which the rollout model {type(self.model).__name__} "
            f"({self.spec.model_path}) does not have; nothing was loaded. Close valid names: "
            f"{', '.join(repr(c) for c in close)}. The stream must use this architecture's Hugging Face "
            f"checkpoint names (as save_pretrained writes them), without wrapper prefixes such as 'module.'."
        )

    # -- memory ----------------------------------------------------------------------------------
    def release(self, tags: Sequence[str]) -> None:
        """``weights``: move the model to host memory. ``kv_cache``: nothing to free; ``generate``
        builds its KV cache per call and drops it on return."""
        tags = check_tags(tags, engine="hf")
        with self._lock:
            if "weights" in tags and "weights" not in self._released:
                self.model.to("cpu")
                self.platform.empty_cache()
                self._released.add("weights")

    def resume(self, tags: Sequence[str]) -> None:
        tags = check_tags(tags, engine="hf")
        with self._lock:
            if "weights" in tags and "weights" in self._released:
                self.model.to(self.device)
                self._released.discard("weights")

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)


class _PreallocatedLayer(DynamicLayer):
    """A full-attention cache layer whose keys and values live in one buffer of ``max_length`` positions,
    allocated at the first update; each update writes its positions in place, and ``keys`` / ``values``
    are views of the filled prefix (what ``DynamicLayer`` holds, without the concatenation)."""

    def __init__(self, max_length: int):
        super().__init__()
        self.max_length = max_length

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buffer = key_states.new_empty(
            (*key_states.shape[:2], self.max_length, key_states.shape[-1])
        )
        self._value_buffer = value_states.new_empty(
            (*value_states.shape[:2], self.max_length, value_states.shape[-1])
        )

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.get_seq_length()
        end = start + key_states.shape[-2]
        if end > self.max_length:
            raise RuntimeError(f"hf rollout: KV cache of {self.max_length} positions overflowed")
        self._key_buffer[:, :, start:end] = key_states
        self._value_buffer[:, :, start:end] = value_states
        self.keys, self.values = self._key_buffer[:, :, :end], self._value_buffer[:, :, :end]
        return self.keys, self.values

    def get_max_length(self) -> int:
        return self.max_length


def _preallocated_cache(config, max_length: int) -> DynamicCache:
    """The cache ``generate`` would build for ``config``, with each plain full-attention layer replaced by a
    :class:`_PreallocatedLayer`; other layer kinds (sliding window, linear attention ...) stay as they are."""
    cache = DynamicCache(config=config)
    cache.layers = [
        _PreallocatedLayer(max_length) if type(layer) is DynamicLayer else layer for layer in cache.layers
    ]
    return cache


def _filters(params: SamplingParams) -> list[LogitsProcessor]:
    """Top-k then top-p, as ``generate`` applies them after the temperature (none when greedy)."""
    if params.temperature == 0:
        return []
    warpers: list[LogitsProcessor] = []
    if params.top_k > 0:
        warpers.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1.0:
        warpers.append(TopPLogitsWarper(params.top_p))
    return warpers


def _sample(
    logits: torch.Tensor,
    temperature: float,
    filters: Sequence[LogitsProcessor],
    generator: torch.Generator,
    logprobs: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One token per row of float32 ``logits [b, V]``, and its log-prob (``None`` unless ``logprobs``).

    Greedy (``temperature == 0``): the argmax, log-prob ``log_softmax(logits)``. Otherwise the log-prob is
    ``log_softmax(logits / temperature)`` of the drawn token, before top-k/top-p (``filters``), and the
    token is drawn from ``softmax(filters(logits / temperature))`` by inverse CDF: one uniform ``u`` in
    ``(0, total]`` per row and the first index whose float64 cumulative probability reaches ``u``. Token
    ``i`` is drawn with probability ``(cdf[i] - cdf[i-1]) / total``, its softmax probability up to float64
    rounding; a token of probability 0 (filtered) is never drawn, as its ``cdf`` entry equals the one
    before. One random number per row, where ``torch.multinomial`` draws one per vocabulary entry.
    """
    if temperature == 0:
        token = logits.argmax(dim=-1)
        if not logprobs:
            return token, None
        return token, torch.log_softmax(logits, dim=-1).gather(-1, token[:, None]).squeeze(-1)
    scaled = logits / temperature if temperature != 1.0 else logits
    scores = scaled
    for fil in filters:
        scores = fil(None, scores)
    cdf = torch.softmax(scores, dim=-1, dtype=torch.float64).cumsum_(dim=-1)
    # 1 - U[0, 1) is in (0, 1], so u > 0 and u <= total (rounding is monotone).
    uniform = torch.rand((cdf.shape[0], 1), generator=generator, device=cdf.device, dtype=cdf.dtype)
    token = torch.searchsorted(cdf, (1.0 - uniform) * cdf[:, -1:]).squeeze(-1)  # first i: cdf[i] >= u
    if not logprobs:
        return token, None
    return token, torch.log_softmax(scaled, dim=-1).gather(-1, token[:, None]).squeeze(-1)


class _LogitBias(LogitsProcessor):
    """Adds :data:`~rlcore.vision.inputs.BANNED_LOGIT` to the logits of ``token_ids``."""

    def __init__(self, token_ids: Sequence[int]):
        self.token_ids = list(token_ids)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = scores.clone()
        scores[:, self.token_ids] += BANNED_LOGIT
        return scores


class _LogProbRecorder(LogitsProcessor):
    """Records ``log_softmax(raw_logits / temperature)`` of each generated token; changes nothing.

    The sampled token of step ``t`` is known only at step ``t + 1`` (it is then ``input_ids[:, -1]``),
    so only one ``[b, V]`` row of log-probs is held at a time; :meth:`result` settles the last step.
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self._pending: torch.Tensor | None = None  # [b, V] log-probs of the step whose token is unknown
        self._steps: list[torch.Tensor] = []  # each [b]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._pending is not None:
            self._steps.append(self._pending.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self._pending = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def result(self, generated: torch.Tensor) -> torch.Tensor:
        """``[b, T]`` log-probs of ``generated [b, T]``. ``generate`` may run one step past the end and
        drop it (deferred stop checks on accelerators); such extra steps are dropped here too."""
        steps = self._steps[: generated.shape[1]]
        if len(steps) < generated.shape[1]:
            steps.append(self._pending.gather(-1, generated[:, -1:]).squeeze(-1))
        if not steps:
            return torch.zeros(generated.shape, dtype=torch.float32)
        return torch.stack(steps, dim=1).cpu()


def _eos_ids(generation_config: GenerationConfig, tokenizer) -> list[int]:
    """Eos ids from the checkpoint's generation config (an int or a list) and the tokenizer, in order."""
    ids = generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("hf rollout: the model declares no eos token (generation_config or tokenizer)")
    return ids


def _check_tied(staged: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> None:
    """Names that share one tensor in the model must not receive different values."""
    by_storage: dict[tuple, list[str]] = {}
    for name, tensor in state.items():
        by_storage.setdefault((tensor.data_ptr(), tuple(tensor.shape)), []).append(name)
    for names in by_storage.values():
        sent = [n for n in names if n in staged]
        for other in sent[1:]:
            if not torch.equal(staged[sent[0]], staged[other].to(staged[sent[0]].device)):
                raise WeightLoadError(
                    f"the rollout model ties {sent[0]!r} and {other!r} (one tensor), but the weight stream "
                    f"sent different values for them; nothing was loaded. Does the trainer untie embeddings "
                    f"(tie_word_embeddings) while the rollout model ties them?"
                )

"""The fake rollout: samples from its own :class:`TinyLM` and returns real log-probs.

See :mod:`rlcore.testing.fakes` for what the fakes are for.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from rlcore.api import Completion, RolloutEngine, RolloutSpec, SamplingParams, WeightBucket
from rlcore.testing.fake_common import (
    Released,
    build_model,
    default_platform,
    offload_params,
    restore_params,
    spend,
)
from rlcore.testing.fake_config import FakeRolloutConfig
from rlcore.testing.tiny_lm import model_path_config, token_log_probs
from rlcore.weights import assemble


class FakeRollout(RolloutEngine):
    """Samples from its own :class:`TinyLM` (``lm`` head). ``released`` is the set of released tags;
    ``weight_version`` counts successful :meth:`load_weights` calls."""

    config_class = FakeRolloutConfig
    RELEASE_TAGS = ("weights", "kv_cache")

    def __init__(self, spec: RolloutSpec, config: FakeRolloutConfig | None = None, platform=None):
        super().__init__(spec, config or FakeRolloutConfig(), default_platform(platform))
        self.device = self.platform.set_device(0)
        self.model = build_model(self.config, spec.model_path, "lm", spec.seed, spec.dtype).to(self.device)
        self.model.eval()
        self.stop_ids = set(self.config.stop_token_ids)
        eos = self.config.eos_token_id
        if eos is None:
            eos = model_path_config(spec.model_path).get("eos_token_id")
        self.stop_ids |= set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        self.weight_version = 0
        self._released = Released("FakeRollout", self.RELEASE_TAGS)
        self._rng = torch.Generator().manual_seed(spec.seed)
        self._rng_lock = threading.Lock()
        self._tokenizer = None

    @property
    def released(self) -> set[str]:
        return set(self._released.tags)

    def _tokenizer_or_none(self):
        if self._tokenizer is None and self.spec.model_path:
            if (Path(self.spec.model_path) / "tokenizer_config.json").is_file():
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(self.spec.model_path)
        return self._tokenizer

    def _check(self, params: SamplingParams) -> None:
        if params.temperature < 0:
            raise ValueError(f"sampling.temperature must be >= 0, got {params.temperature}")
        if not 0 < params.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {params.top_p}")
        if params.stop and self._tokenizer_or_none() is None:
            raise ValueError(
                f"sampling.stop={list(params.stop)} needs a tokenizer, and {self.spec.model_path!r} has none; "
                f"use fake.stop_token_ids instead"
            )

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Completion]]:
        self._released.require("generate", "weights", "kv_cache")
        self._check(params)
        spend(self.config.generate_cost_s)
        return [self._sample(list(p), params, row) for row, p in enumerate(prompts)]

    async def agenerate(self, prompt: Sequence[int], params: SamplingParams) -> list[Completion]:
        # A worker thread, so many requests (each possibly paying generate_cost_s) overlap.
        return (await asyncio.to_thread(self.generate, [prompt], params))[0]

    def _generator(self, params: SamplingParams) -> torch.Generator:
        if params.seed is not None:
            seed = params.seed
        else:
            with self._rng_lock:
                seed = int(torch.randint(2**62, (1,), generator=self._rng))
        return torch.Generator(device=self.device).manual_seed(seed)

    @torch.no_grad()
    def _sample(self, prompt: list[int], params: SamplingParams, row: int) -> list[Completion]:
        if not prompt:
            raise ValueError(f"prompt {row} is empty; every prompt needs at least one token")
        budget = min(params.max_tokens, self.spec.max_model_len - len(prompt))
        if budget < 1:
            raise ValueError(
                f"prompt {row} has {len(prompt)} tokens, which leaves no room under max_model_len="
                f"{self.spec.max_model_len}"
            )
        n, greedy = params.n, params.temperature == 0
        gen = None if greedy else self._generator(params)
        # The model sees (previous, current) token pairs; mask the previous one for a 1-token prompt.
        window = torch.tensor([[prompt[-2] if len(prompt) > 1 else 0, prompt[-1]]] * n, device=self.device)
        mask = torch.tensor([[int(len(prompt) > 1), 1]] * n, device=self.device)
        tokens: list[list[int]] = [[] for _ in range(n)]
        log_probs: list[list[float]] = [[] for _ in range(n)]
        finish = ["length"] * n
        texts: list[str | None] = [None] * n  # set when a stop string ends a completion
        active = list(range(n))
        for _ in range(budget):
            logits = self.model(window, mask)[:, 1]  # [n, V]
            chosen = self._choose(logits, params, gen)
            lp, _ = token_log_probs(logits, chosen, params.temperature if not greedy else 1.0)
            for i in list(active):
                token = int(chosen[i])
                tokens[i].append(token)
                log_probs[i].append(float(lp[i]))
                if token in self.stop_ids or self._hit_stop_string(tokens[i], params, texts, i):
                    finish[i] = "stop"
                    active.remove(i)
            if not active:
                break
            window = torch.stack([window[:, 1], chosen], dim=1)
            mask = torch.ones_like(mask)
        tok = self._tokenizer_or_none()
        out = []
        for i in range(n):
            text = texts[i]
            if text is None:
                text = tok.decode(tokens[i], skip_special_tokens=True) if tok is not None else ""
            out.append(
                Completion(
                    list(prompt), tokens[i], log_probs[i] if params.logprobs else None, finish[i], text
                )
            )
        return out

    def _hit_stop_string(self, tokens: list[int], params: SamplingParams, texts: list, i: int) -> bool:
        if not params.stop:
            return False
        text = self._tokenizer_or_none().decode(tokens, skip_special_tokens=True)
        for s in params.stop:
            at = text.find(s)
            if at >= 0:
                texts[i] = text[:at]  # as vLLM: the stop string itself is not part of the text
                return True
        return False

    @staticmethod
    def _choose(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None) -> torch.Tensor:
        """Next token per row of ``logits [n, V]``: argmax when greedy, else a draw after top-k/top-p."""
        if gen is None:
            return logits.argmax(-1)
        scaled = logits.float() / params.temperature
        if 0 < params.top_k < scaled.shape[-1]:
            kth = scaled.topk(params.top_k, dim=-1).values[:, -1:]
            scaled = scaled.masked_fill(scaled < kth, -math.inf)
        if params.top_p < 1:
            probs, order = scaled.softmax(-1).sort(-1, descending=True)
            # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
            drop_sorted = probs.cumsum(-1) - probs >= params.top_p
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            scaled = scaled.masked_fill(drop, -math.inf)
        return torch.multinomial(scaled.softmax(-1), 1, generator=gen).squeeze(-1)

    def load_weights(self, buckets: Iterable[WeightBucket]) -> None:
        self._released.require("load_weights", "weights")
        params = dict(self.model.named_parameters())
        staged = {}
        # Check the whole stream before copying anything: a bad name leaves the old weights intact.
        for name, tensor in assemble(buckets):
            if name not in params:
                raise ValueError(
                    f"FakeRollout.load_weights: unknown weight {name!r}; this model has {sorted(params)}"
                )
            if tuple(tensor.shape) != tuple(params[name].shape):
                raise ValueError(
                    f"FakeRollout.load_weights: {name!r} has shape {tuple(tensor.shape)}, "
                    f"the model expects {tuple(params[name].shape)}"
                )
            staged[name] = tensor
        with torch.no_grad():
            for name, tensor in staged.items():
                params[name].copy_(tensor.to(device=self.device, dtype=params[name].dtype))
        self.weight_version += 1

    def release(self, tags: Sequence[str]) -> None:
        for tag in self._released.check(tags):
            if tag == "weights" and tag not in self._released.tags:
                self._released.stash["weights"] = offload_params(self.model)
            self._released.tags.add(tag)  # kv_cache: the fake keeps no cache between calls
        self.platform.empty_cache()  # hand the freed device memory back

    def resume(self, tags: Sequence[str]) -> None:
        for tag in self._released.check(tags):
            if tag == "weights" and tag in self._released.tags:
                restore_params(self.model, self._released.stash.pop("weights"), self.device)
            self._released.tags.discard(tag)

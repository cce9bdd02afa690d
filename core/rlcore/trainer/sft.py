"""Supervised fine-tuning with a run's own train engine: the warm-up before RL, and a trainer of its own.

:class:`SFTTrainer` drives any :class:`~rlcore.cluster.roles.TrainRole` (FSDP, Megatron, the fake
engine; on Ray or in-process) with :class:`NLLLoss`, the token-mean negative log-likelihood of the
response tokens. Examples come from files of ``prompt`` (chat messages, rendered with the tokenizer's
chat template as RL prompts are) and a response text (:func:`load_sft_examples`); the model learns to
write the response followed by the end-of-sequence token, exactly the tokens a rollout would sample.

The engine computes log-probs of ``logits / EngineSpec.temperature`` (the rollout's sampling
temperature), so with a temperature other than 1 the warm-up fits the distribution the rollout samples
from, not the raw logits.

>>> examples = load_sft_examples(["sft.jsonl"], tokenizer)  # doctest: +SKIP
>>> trainer = SFTTrainer(actor_role, examples, batch_size=32, pad_token_id=tokenizer.pad_token_id)  # doctest: +SKIP
>>> trainer.fit(20)[-1]["sft/loss"]  # doctest: +SKIP
0.41
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np
import torch

from rlcore.api import Batch, Completion
from rlcore.data.files import DataError, read_file
from rlcore.rollout.batching import completions_to_batch


@attrs.define
class NLLLoss:
    """Token-mean negative log-likelihood of the response tokens (a :data:`rlcore.api.LossFn`).

    ``outputs["log_probs"] [b, R]``: the engine's log-probs of ``responses``; ``micro_batch["response_mask"]
    [b, R]`` marks the tokens to learn. The sum over this micro-batch is divided by
    ``meta["global_tokens"]`` (the mini-batch's tokens over all data-parallel ranks) when present, so
    the engine's sum of micro-batch gradients is the gradient of the mini-batch's token mean; else by the
    micro-batch's own token count. Metric ``sft/nll``: this micro-batch's token mean.
    """

    def __call__(
        self, outputs: dict[str, torch.Tensor], micro_batch: Batch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        if "log_probs" not in outputs:
            raise KeyError(
                f"NLLLoss needs outputs['log_probs'] (a policy head); outputs has {sorted(outputs)}"
            )
        log_probs = outputs["log_probs"]
        mask = micro_batch["response_mask"].to(device=log_probs.device, dtype=log_probs.dtype)
        nll = -(log_probs * mask).sum()
        tokens = float(mask.sum())
        total = micro_batch.meta.get("global_tokens") or tokens
        return nll / max(float(total), 1.0), {"sft/nll": float(nll.detach()) / max(tokens, 1.0)}


@attrs.define
class SFTExample:
    """One example: the rendered prompt's token ids and the response's (end-of-sequence included); with
    images, ``multi_modal`` holds them (``{"image": [PIL.Image, ...]}``) and ``prompt_ids`` is the prompt
    as the model reads it, each image's token repeated for its patches (what a rollout returns)."""

    prompt_ids: list[int]
    response_ids: list[int]
    multi_modal: dict[str, Any] | None = None


def load_sft_examples(
    files: Sequence[str | os.PathLike],
    tokenizer: Any,
    *,
    prompt_key: str = "prompt",
    response_key: str = "response",
    apply_chat_template: bool = True,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    image_key: str = "images",
    vision: Any = None,
) -> list[SFTExample]:
    """Examples from parquet/jsonl ``files``: column ``prompt_key`` holds chat messages (or text, with
    ``apply_chat_template=False``), column ``response_key`` the response text. Prompts are rendered as
    RL prompts are (chat template with the generation prompt and ``chat_template_kwargs``, the run's
    ``data.apply_chat_template_kwargs``: the tools' schemas of an agent run among them); responses get
    the tokenizer's end-of-sequence token appended. A bad row, or one over a length limit, is an error
    naming it.

    Rows with images (column ``image_key``, as in RL data: :mod:`rlcore.data.images`) need ``vision``,
    the model's :class:`~rlcore.vision.VisionInputs`: the prompt is expanded for its images as the
    trainer reads it, and the length limit counts one token per image, as RL prompts do."""
    if not files:
        raise DataError(
            "no SFT data files given: set sft.files to parquet/jsonl files of prompt/response rows"
        )
    eos = tokenizer.eos_token_id
    if eos is None:
        raise DataError(
            f"the tokenizer ({type(tokenizer).__name__}) has no end-of-sequence token to end responses with"
        )
    examples = []
    for path in files:
        loaded = read_file(path)
        for i, row in enumerate(loaded.rows):
            where = loaded.where(i)
            row, media = _with_images(row, loaded.path, where, prompt_key, image_key, vision)
            text = _render_prompt(
                row, where, tokenizer, prompt_key, apply_chat_template, chat_template_kwargs
            )
            response = row.get(response_key)
            if not isinstance(response, str):
                raise DataError(
                    f"{where}: column {response_key!r} must hold the response text (a string), got "
                    f"{type(response).__name__}; set sft.response_key to the column holding it"
                )
            prompt_ids = list(tokenizer(text, add_special_tokens=not apply_chat_template)["input_ids"])
            response_ids = [*tokenizer(response, add_special_tokens=False)["input_ids"], eos]
            for what, ids, limit, key in (
                ("prompt", prompt_ids, max_prompt_length, "data.max_prompt_length"),
                ("response", response_ids, max_response_length, "sft.max_response_length"),
            ):
                if limit is not None and len(ids) > limit:
                    raise DataError(
                        f"{where}: the {what} is {len(ids)} tokens long, over {key}={limit}; raise it"
                    )
            if media is not None:
                prompt_ids, _ = vision.prompt_inputs(prompt_ids, media)
            examples.append(SFTExample(prompt_ids, response_ids, media))
    return examples


def _with_images(
    row: dict[str, Any], path: str, where: str, prompt_key: str, image_key: str, vision: Any
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``row`` with its prompt's ``<image>`` places made image parts, and its images; ``(row, None)`` for a
    row without any."""
    from rlcore.data.images import prompt_images

    if row.get(image_key) is None:
        return row, None
    prompt, images = prompt_images(
        row.get(prompt_key), row[image_key], data_file=path, where=where, key=image_key
    )
    if not images:
        return row, None
    if vision is None:
        raise DataError(
            f"{where}: the row has images (column {image_key!r}) but the model has no vision tower; "
            "warm up a vision-language model or drop the column"
        )
    return {**row, prompt_key: prompt}, {"image": images}


def _render_prompt(
    row: dict[str, Any],
    where: str,
    tokenizer: Any,
    key: str,
    chat: bool,
    kwargs: dict[str, Any] | None = None,
) -> str:
    prompt = row.get(key)
    if isinstance(prompt, str) and not chat:
        return prompt
    valid = (
        isinstance(prompt, list)
        and prompt
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and m.get("content") is not None
            for m in prompt
        )
    )
    if not valid:
        raise DataError(
            f'{where}: column {key!r} must hold chat messages [{{"role": "user", "content": ...}}] '
            f"(or text, with data.apply_chat_template=false), got {type(prompt).__name__}"
        )
    if not chat:
        return "\n".join(str(m["content"]) for m in prompt)
    return tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False, **(kwargs or {}))


def sft_batch(examples: Sequence[SFTExample], pad_token_id: int) -> Batch:
    """The standard train layout (:func:`~rlcore.rollout.batching.completions_to_batch`) of ``examples``:
    ``input_ids``/``attention_mask``/``position_ids [B, P+R]``, ``responses``/``response_mask [B, R]``;
    with images, ``objects["multi_modal_data"]`` (one entry a row, None for a row without), as a rollout's
    batch carries them to the trainer."""
    completions = [Completion(list(e.prompt_ids), list(e.response_ids), None, "stop") for e in examples]
    batch = completions_to_batch(completions, pad_token_id)
    if any(e.multi_modal is not None for e in examples):
        batch.objects["multi_modal_data"] = [e.multi_modal for e in examples]
    return batch


class SFTTrainer:
    """Optimizer steps of :class:`NLLLoss` on ``role`` over ``examples``, ``batch_size`` at a time.

    Examples are visited epoch by epoch in an order seeded by ``(seed, epoch)``; a batch may span two
    epochs, and a set smaller than ``batch_size`` is used whole every step. Each :meth:`step` is one
    optimizer step (``role.train`` with the whole batch as its mini-batch).
    """

    def __init__(
        self,
        role: Any,
        examples: Sequence[SFTExample],
        *,
        batch_size: int,
        pad_token_id: int,
        seed: int = 0,
        loss: Any = None,
    ):
        if not examples:
            raise ValueError("SFTTrainer needs at least one example")
        if batch_size < 1:
            raise ValueError(f"SFT batch size must be >= 1, got {batch_size}")
        self.role, self.examples = role, list(examples)
        self.batch_size = min(batch_size, len(self.examples))
        self.pad_token_id, self.seed = pad_token_id, seed
        self.loss = loss if loss is not None else NLLLoss()
        self.steps_done = 0
        self._epoch, self._order, self._pos = 0, self._permutation(0), 0

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.examples))

    def next_examples(self) -> list[SFTExample]:
        """The next ``batch_size`` examples in the seeded order."""
        picked = []
        while len(picked) < self.batch_size:
            if self._pos == len(self._order):
                self._epoch += 1
                self._order, self._pos = self._permutation(self._epoch), 0
            take = min(self.batch_size - len(picked), len(self._order) - self._pos)
            picked += [self.examples[int(i)] for i in self._order[self._pos : self._pos + take]]
            self._pos += take
        return picked

    def step(self) -> dict[str, float]:
        """One optimizer step. Metrics: ``sft/loss`` (the batch's token-mean NLL), ``sft/grad_norm``,
        ``sft/lr``, ``sft/tokens`` and ``sft/epoch``."""
        batch = sft_batch(self.next_examples(), self.pad_token_id)
        metrics = self.role.train(batch, self.loss, mini_batch_size=None)
        self.steps_done += 1
        out = {f"sft/{k}": v for k, v in metrics.items() if k in ("loss", "grad_norm", "lr")}
        out["sft/tokens"] = float(batch["response_mask"].sum())
        out["sft/epoch"] = float(self._epoch)
        return out

    def fit(
        self, steps: int, on_step: Callable[[int, dict[str, float]], None] | None = None
    ) -> list[dict[str, float]]:
        """``steps`` optimizer steps; ``on_step(k, metrics)`` after each (``k`` from 1). Returns the metrics."""
        history = []
        for _ in range(steps):
            metrics = self.step()
            history.append(metrics)
            if on_step is not None:
                on_step(self.steps_done, metrics)
        return history

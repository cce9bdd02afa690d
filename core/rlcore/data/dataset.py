"""The prompt dataset: rows of verl-schema files, rendered with the chat template and tokenized once.

Loading validates every row (errors name file, row and column), renders the prompt, tokenizes it, and
then either drops prompts longer than ``max_prompt_length`` (``filter_overlong_prompts``) or applies the
``truncation`` mode to them. Token ids are kept as ``int32`` arrays (about as large as the text itself).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlcore.data.config import DataConfig
from rlcore.data.files import DataError, LoadedFile, read_file
from rlcore.data.images import prompt_images
from rlcore.data.schema import RESERVED_NAMES, Sample, check_columns, parse_row

logger = logging.getLogger(__name__)

_TOKENIZE_CHUNK = 1024


class RLDataset:
    """Prompts from one or more files in verl's schema.

    ``dataset[i]`` is a dict with ``input_ids`` (``int32 [L]``, ``L <= max_prompt_length``), ``raw_prompt``
    (the messages, or the text in raw mode), ``data_source``, ``ground_truth``, ``reward_model``,
    ``extra_info``, ``index`` (the row's position in the concatenation of all files, counted before
    filtering, so it names the source row: see :meth:`where`), any extra columns, and for a row with
    images ``multi_modal_data`` (``{"image": [PIL.Image, ...]}``; its ``input_ids`` hold one image token
    per image, as the chat template writes it: ``max_prompt_length`` counts the prompt so).

    >>> ds = RLDataset(["train.parquet"], tokenizer, DataConfig(max_prompt_length=256))  # doctest: +SKIP
    >>> ds.num_filtered, len(ds)  # doctest: +SKIP
    (3, 7470)
    """

    def __init__(
        self,
        files: str | os.PathLike | Sequence[str | os.PathLike],
        tokenizer: Any,
        config: DataConfig,
        *,
        split: str = "train",
    ):
        if isinstance(files, str | os.PathLike):
            files = [files]
        self.files = [os.fspath(f) for f in files]
        if not self.files:
            raise DataError(
                f"no {split} data files given: set data.{split}_files to a list of parquet/jsonl paths."
            )
        self.tokenizer = tokenizer
        self.config = config
        self.split = split
        self.pad_token_id = _pad_token_id(tokenizer)
        if config.apply_chat_template and getattr(tokenizer, "chat_template", None) is None:
            raise DataError(
                f"the tokenizer ({type(tokenizer).__name__}) has no chat template, so data.apply_chat_template=true "
                "cannot render the prompts. Use a chat model's tokenizer, or set data.apply_chat_template=false "
                "to use the prompt text as-is."
            )

        self._loaded: list[LoadedFile] = []
        self._offsets: list[int] = []  # global row id of each file's first row
        samples: list[Sample] = []
        for path in self.files:
            loaded = read_file(path)
            check_columns(loaded, config.prompt_key)
            self._warn_reserved(loaded)
            self._offsets.append(len(samples))
            for i in range(len(loaded.rows)):
                sample = parse_row(loaded, i, config.prompt_key, not config.apply_chat_template)
                samples.append(self._with_images(sample, loaded, i))
            # Rows now live in ``samples``; keep only the file's metadata for error messages.
            loaded.rows = []
            self._loaded.append(loaded)

        #: Prompts dropped for being longer than ``max_prompt_length`` / shortened by ``truncation``.
        self.num_filtered = 0
        self.num_truncated = 0
        ids = self._tokenize(samples)
        self._samples, self._ids, self._index = self._limit_lengths(samples, ids)

    # -- loading ---------------------------------------------------------------------------------
    def _with_images(self, sample: Sample, loaded: LoadedFile, row: int) -> Sample:
        """A row with images (``data.image_key``): decoded now, so a missing or unreadable image stops the
        run at load naming its file and row; carried as ``multi_modal_data`` (``{"image": [...]}``) and the
        prompt's ``<image>`` placeholders made image parts for the chat template."""
        value = sample.extras.pop(self.config.image_key, None)
        if value is None:
            return sample
        sample.prompt, images = prompt_images(
            sample.prompt, value, data_file=loaded.path, where=loaded.where(row), key=self.config.image_key
        )
        if not images:
            return sample
        sample.extras["multi_modal_data"] = {"image": images}
        return sample

    def _render(self, sample: Sample, row: int) -> str:
        if not self.config.apply_chat_template:
            if isinstance(sample.prompt, str):
                return sample.prompt
            return "\n".join(str(m["content"]) for m in sample.prompt)
        try:
            return self.tokenizer.apply_chat_template(
                sample.prompt,
                add_generation_prompt=True,
                tokenize=False,
                **self.config.apply_chat_template_kwargs,
            )
        except Exception as exc:
            raise DataError(
                f"{self.where(row)}, column {self.config.prompt_key!r}: the tokenizer's chat template failed on "
                f"these messages ({type(exc).__name__}: {exc}). Fix the messages, or set "
                "data.apply_chat_template=false to use the raw text."
            ) from exc

    def _tokenize(self, samples: list[Sample]) -> list[np.ndarray]:
        # A rendered chat template already holds its special tokens; raw text gets the tokenizer's own
        # (a BOS for Llama-style tokenizers), as it would when prompting the model directly.
        add_special = not self.config.apply_chat_template
        ids: list[np.ndarray] = []
        for start in range(0, len(samples), _TOKENIZE_CHUNK):
            chunk = samples[start : start + _TOKENIZE_CHUNK]
            texts = [self._render(s, start + k) for k, s in enumerate(chunk)]
            encoded = self.tokenizer(texts, add_special_tokens=add_special)["input_ids"]
            ids.extend(np.asarray(e, dtype=np.int32) for e in encoded)
        return ids

    def _limit_lengths(
        self, samples: list[Sample], ids: list[np.ndarray]
    ) -> tuple[list[Sample], list[np.ndarray], np.ndarray]:
        limit = self.config.max_prompt_length
        overlong = [i for i, x in enumerate(ids) if len(x) > limit]
        keep = np.arange(len(samples), dtype=np.int64)
        if overlong and self.config.filter_overlong_prompts:
            drop = set(overlong)
            keep = np.asarray([i for i in range(len(samples)) if i not in drop], dtype=np.int64)
            self.num_filtered = len(overlong)
            logger.info(
                "%s set: dropped %d of %d prompts longer than data.max_prompt_length=%d tokens",
                self.split,
                len(overlong),
                len(samples),
                limit,
            )
            if len(keep) == 0:
                raise DataError(
                    f"every one of the {len(samples)} prompts in {self.files} is longer than "
                    f"data.max_prompt_length={limit} tokens. Raise data.max_prompt_length."
                )
        elif overlong and self.config.truncation == "error":
            first = overlong[0]
            raise DataError(
                f"{self.where(first)}: the prompt is {len(ids[first])} tokens long, over "
                f"data.max_prompt_length={limit} ({len(overlong)} prompts of {len(samples)} are). Raise "
                "data.max_prompt_length, set data.truncation to left/right/middle, or set "
                "data.filter_overlong_prompts=true to drop them."
            )
        elif overlong:
            for i in overlong:
                ids[i] = truncate(ids[i], limit, self.config.truncation)
            self.num_truncated = len(overlong)
            logger.info(
                "%s set: truncated %d of %d prompts to data.max_prompt_length=%d tokens (%s)",
                self.split,
                len(overlong),
                len(samples),
                limit,
                self.config.truncation,
            )
        return [samples[i] for i in keep], [ids[i] for i in keep], keep

    def _warn_reserved(self, loaded: LoadedFile) -> None:
        # These names are filled by the loader itself; a data column of that name would be shadowed.
        clash = sorted((set(loaded.columns) & RESERVED_NAMES) - {"data_source", "reward_model", "extra_info"})
        if clash:
            logger.warning(
                "data file %r: columns %s are not carried into batches (rlcore fills fields of those names)",
                loaded.path,
                clash,
            )

    # -- access ----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._samples)

    def __getitem__(self, i: int) -> dict[str, Any]:
        s = self._samples[i]
        return {
            **s.extras,
            "input_ids": self._ids[i],
            "raw_prompt": s.prompt,
            "data_source": s.data_source,
            "ground_truth": s.ground_truth,
            "reward_model": s.reward_model,
            "extra_info": s.extra_info,
            "index": int(self._index[i]),
        }

    def position(self, index: int) -> int:
        """The position ``i`` (``self[i]``) of the sample whose ``index`` field is ``index``."""
        if not hasattr(self, "_positions"):
            self._positions = {int(x): i for i, x in enumerate(self._index)}
        try:
            return self._positions[int(index)]
        except KeyError:
            raise KeyError(
                f"no sample with index {index} in the {self.split} data (it has {len(self)} samples): the data "
                "files changed since the checkpoint that names it was written"
            ) from None

    def where(self, index: int) -> str:
        """Where global row ``index`` (the ``index`` field of a sample) came from: file, row and line."""
        k = int(np.searchsorted(self._offsets, index, side="right")) - 1
        return self._loaded[k].where(index - self._offsets[k])


def truncate(ids: np.ndarray, limit: int, mode: str) -> np.ndarray:
    """Shorten ``ids [L]`` to ``limit`` tokens: ``left`` keeps the end, ``right`` the start, ``middle`` both
    ends (``limit // 2`` from the start, the rest from the end), as verl does."""
    if len(ids) <= limit:
        return ids
    if mode == "left":
        return ids[len(ids) - limit :]
    if mode == "right":
        return ids[:limit]
    if mode == "middle":
        head = limit // 2
        return np.concatenate([ids[:head], ids[len(ids) - (limit - head) :]])
    raise DataError(f"data.truncation must be one of left, right, middle to shorten a prompt; got {mode!r}")


def _pad_token_id(tokenizer: Any) -> int:
    # Many base-model tokenizers have no pad token; verl pads with EOS then, and so do we (the mask
    # tells padding apart).
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    raise DataError(
        f"the tokenizer ({type(tokenizer).__name__}) has neither a pad token nor an EOS token to pad prompts "
        "with. Set tokenizer.pad_token before building the dataset."
    )

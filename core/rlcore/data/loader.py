"""Batches of prompts as :class:`rlcore.api.Batch`, in a seeded per-epoch order, resumable mid-epoch.

The order of epoch ``e`` is a pure function of ``(seed, e)``, and the loader's state is just
``(epoch, batches already taken)``; so a loader restored from :meth:`PromptLoader.state_dict` yields
exactly the batches the uninterrupted one would have.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from rlcore.api.batch import Batch
from rlcore.data.config import DataConfig
from rlcore.data.dataset import RLDataset
from rlcore.data.files import DataError

STATE_VERSION = 1


class PromptLoader:
    """Iterates over ``dataset`` in batches of ``batch_size`` prompts.

    Each ``for batch in loader`` runs over the rest of the current epoch, then moves to the next one.
    A batch holds tensors ``prompts [B, P]`` (left-padded with the pad id, ``P`` the longest prompt of
    the batch), ``prompt_mask [B, P]`` and ``attention_mask [B, P]`` (1 on real tokens, int64), and
    objects ``raw_prompt``, ``data_source``, ``ground_truth``, ``reward_model``, ``extra_info``,
    ``index`` and any extra data columns. ``batch.meta`` has ``epoch``.
    """

    def __init__(
        self,
        dataset: RLDataset,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
    ):
        if batch_size < 1:
            raise DataError(f"batch size must be a positive integer, got {batch_size}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.pad_token_id = dataset.pad_token_id
        self._epoch = 0
        self._taken = 0  # batches of the current epoch already yielded
        if len(self) == 0:
            raise DataError(
                f"the {dataset.split} set has {len(dataset)} prompts, fewer than one batch of {batch_size} "
                f"with drop_last (files: {dataset.files}). Lower data.{dataset.split}_batch_size, add data, "
                "or set data.dataloader_drop_last=false."
            )

    def __len__(self) -> int:
        """Batches per epoch."""
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from."""
        return self._epoch + 1 if self._taken >= len(self) else self._epoch

    def order(self, epoch: int) -> np.ndarray:
        """Dataset positions in the order epoch ``epoch`` visits them (``int64 [N]``)."""
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n, dtype=np.int64)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    def __iter__(self) -> Iterator[Batch]:
        if self._taken >= len(self):
            self._epoch, self._taken = self._epoch + 1, 0
        order = self.order(self._epoch)
        while self._taken < len(self):
            rows = order[self._taken * self.batch_size : (self._taken + 1) * self.batch_size]
            # Counted before the yield: a checkpoint written while this batch is being trained on
            # records it as taken, so a resumed run starts at the next one.
            self._taken += 1
            yield self.collate([self.dataset[int(i)] for i in rows], meta={"epoch": self._epoch})
        self._epoch, self._taken = self._epoch + 1, 0

    def full_pass(self, epoch: int = 0) -> Iterator[Batch]:
        """Every batch of epoch ``epoch``, leaving the loader's position alone (validation passes)."""
        order = self.order(epoch)
        for k in range(len(self)):
            rows = order[k * self.batch_size : (k + 1) * self.batch_size]
            yield self.collate([self.dataset[int(i)] for i in rows], meta={"epoch": epoch})

    def collate(self, items: list[dict[str, Any]], meta: dict[str, Any] | None = None) -> Batch:
        """Left-pad the ``input_ids`` of ``items`` into a :class:`Batch` (see the class docstring)."""
        width = max(len(it["input_ids"]) for it in items)
        prompts = torch.full((len(items), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        for r, it in enumerate(items):
            ids = torch.from_numpy(it["input_ids"]).long()
            if len(ids):
                prompts[r, width - len(ids) :] = ids
                mask[r, width - len(ids) :] = 1
        keys = [k for k in items[0] if k != "input_ids"]
        objects = {k: [it.get(k) for it in items] for k in keys}
        return Batch({"prompts": prompts, "prompt_mask": mask, "attention_mask": mask.clone()}, objects, meta)

    # -- checkpointing ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: the epoch and how many of its batches were taken, plus what must not
        change for a resume to reproduce the same order."""
        epoch, taken = (self._epoch + 1, 0) if self._taken >= len(self) else (self._epoch, self._taken)
        return {
            "version": STATE_VERSION,
            "epoch": epoch,
            "batches_taken": taken,
            "num_prompts": len(self.dataset),
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; refuse when the data or batching changed since it was taken."""
        mine = self.state_dict()
        changed = [
            f"{k}: checkpoint {state.get(k)!r}, now {mine[k]!r}"
            for k in ("num_prompts", "batch_size", "shuffle", "seed", "drop_last")
            if state.get(k) != mine[k]
        ]
        if changed:
            raise DataError(
                f"cannot resume the {self.dataset.split} data loader: {'; '.join(changed)}. The resumed run "
                "would not see the batches the interrupted one would have. Restore the original data files and "
                "data settings, or start a new run without this checkpoint."
            )
        if not 0 <= state["batches_taken"] <= len(self):
            raise DataError(
                f"data loader state has batches_taken={state['batches_taken']}, outside 0..{len(self)}"
            )
        self._epoch, self._taken = int(state["epoch"]), int(state["batches_taken"])


def build_train_loader(config: DataConfig, tokenizer: Any) -> PromptLoader:
    """The training loader: ``config.train_files``, shuffled per epoch, ``train_batch_size`` prompts."""
    dataset = RLDataset(config.train_files, tokenizer, config, split="train")
    return PromptLoader(
        dataset,
        config.train_batch_size,
        shuffle=config.shuffle,
        seed=config.seed,
        drop_last=config.dataloader_drop_last,
    )


def build_val_loader(config: DataConfig, tokenizer: Any) -> PromptLoader | None:
    """The validation loader (file order, never shuffled), or ``None`` without val files.

    Iterate it with :meth:`PromptLoader.full_pass` so that each validation sees every prompt once.
    """
    if not config.val_files:
        return None
    dataset = RLDataset(config.val_files, tokenizer, config, split="val")
    return PromptLoader(
        dataset, config.val_batch_size or len(dataset), shuffle=False, seed=config.seed, drop_last=False
    )

"""From rlcore's padded batch layout to what Megatron's GPT model computes on, and back.

rlcore batches are ``[B, P+R]``: prompts left-padded, responses right-padded, real tokens contiguous.
megatron-core's GPT model applies rotary positions ``0..s-1`` to every row and masks attention only
causally, so each row is shifted left until its first real token sits at position 0 (verl does the
same). Padding then trails the real tokens, where causal attention keeps it from influencing them, and
rotary positions equal the HF ``position_ids`` of the real tokens.
"""

from __future__ import annotations

import attrs
import torch
from rlcore.api import Batch


@attrs.frozen
class Aligned:
    """Rows shifted left. ``tokens [b, L]`` (L padded up to a multiple), ``lead [b]`` (pad tokens
    removed from the front of each row), ``lengths [b]`` (real tokens), ``width`` (the original P+R)."""

    tokens: torch.Tensor
    lead: torch.Tensor
    lengths: torch.Tensor
    width: int

    @property
    def position_ids(self) -> torch.Tensor:
        b, length = self.tokens.shape
        return torch.arange(length, device=self.tokens.device).expand(b, length)

    def next_tokens(self) -> torch.Tensor:
        """``[b, L]``: the token each position predicts (0 past the end; those positions are unused)."""
        nxt = torch.zeros_like(self.tokens)
        nxt[:, :-1] = self.tokens[:, 1:]
        return nxt


def left_align(input_ids: torch.Tensor, attention_mask: torch.Tensor, multiple: int = 1) -> Aligned:
    """Shift each row of ``input_ids [b, S]`` so that its real tokens (``attention_mask`` 1) start at 0.

    Raises ``ValueError`` if a row's real tokens are not contiguous.
    """
    mask = attention_mask.bool()
    b, width = input_ids.shape
    lengths = mask.sum(1)
    cols = torch.arange(width, device=input_ids.device)
    lead = torch.where(lengths > 0, torch.where(mask, cols, width).min(1).values, 0)
    expected = (cols >= lead[:, None]) & (cols < (lead + lengths)[:, None])
    if not torch.equal(mask, expected):
        row = int((mask != expected).any(1).nonzero()[0])
        raise ValueError(
            f"attention_mask row {row} has padding between real tokens; the megatron engine needs each "
            f"row's real tokens contiguous (left-padded prompt + right-padded response)"
        )
    length = max(int(lengths.max()) if b else 0, 1)
    length = -(-length // multiple) * multiple
    src = (torch.arange(length, device=input_ids.device) + lead[:, None]).clamp(max=width - 1)
    tokens = input_ids.gather(1, src)
    tokens = torch.where(torch.arange(length, device=input_ids.device) < lengths[:, None], tokens, 0)
    return Aligned(tokens=tokens, lead=lead, lengths=lengths, width=width)


def restore(values: torch.Tensor, aligned: Aligned) -> torch.Tensor:
    """``values [b, L]`` on aligned positions -> ``[b, S]`` on the original columns (0 on padding).

    Differentiable (a gather), so losses on restored values train the model.
    """
    b, length = values.shape
    cols = torch.arange(aligned.width, device=values.device)
    src = cols[None, :] - aligned.lead[:, None]
    valid = (src >= 0) & (src < aligned.lengths[:, None])
    out = values.gather(1, src.clamp(0, length - 1))
    return torch.where(valid, out, torch.zeros((), dtype=values.dtype, device=values.device))


def response_columns(per_position: torch.Tensor, response_length: int) -> torch.Tensor:
    """``[b, S]`` values computed at each position (about the *next* token) -> ``[b, R]`` for the
    response tokens: the prediction of response token ``j`` sits one column before it."""
    width = per_position.shape[1]
    return per_position[:, width - response_length - 1 : width - 1]


def micro_batches(batch: Batch, size: int, max_tokens: int | None = None) -> list[Batch]:
    """Consecutive micro-batches of at most ``size`` rows, or (with ``max_tokens``) as many rows as
    fit ``rows * longest_real_length <= max_tokens`` (a longer row goes alone). Order is kept, so
    per-micro-batch outputs concatenate back into the batch's order."""
    if max_tokens is None:
        return batch.split(size)
    lengths = batch["attention_mask"].sum(1).tolist()
    pieces, start, longest = [], 0, 0
    for i, n in enumerate(lengths):
        longest_with = max(longest, int(n))
        if i > start and (i - start + 1) * longest_with > max_tokens:
            pieces.append(batch.index(slice(start, i)))
            start, longest_with = i, int(n)
        longest = longest_with
    if len(batch):
        pieces.append(batch.index(slice(start, len(batch))))
    return pieces

"""Splitting a rank's batch into micro-batches, and turning a micro-batch into model inputs.

Every FSDP forward and backward is collective, so all data-parallel ranks must run the same number of
micro-batches even when their shards differ in size or length. :func:`rlcore.kernels.micro_batches.plan_micro_batches` splits one
rank's rows (fixed size, or by token budget into as few micro-batches as fit, with even loads);
:func:`equalize` then brings every rank to the common count by splitting its largest micro-batches,
or, when a rank has too few rows, by adding dummy micro-batches whose loss is multiplied by zero.

:func:`build_inputs` lays a micro-batch out for :class:`rlcore_fsdp.model.HeadedModel`, padded
(``[b, T']`` plus the attention mask, ``T'`` the columns holding any real token) or packed (the ``N``
real tokens in one row, ``position_ids`` restarting at 0 per sequence, no mask), and lists the flat
positions whose hidden states the head reads.
"""

from __future__ import annotations

import attrs
import torch
from rlcore.api import Batch
from rlcore.api.batch import to_device

from rlcore_fsdp.vision import VisionLayout


@attrs.frozen
class MicroBatch:
    """Rows of the rank's batch; ``dummy``: run only to keep collectives in step, contributes nothing."""

    rows: tuple[int, ...]
    dummy: bool = False


def equalize(parts: list[list[int]], count: int) -> list[MicroBatch]:
    """Exactly ``count >= len(parts)`` micro-batches: split the largest ones in halves while a part has
    two rows or more, then pad with dummy micro-batches (row 0 again)."""
    if not parts:
        raise ValueError(
            "a rank received an empty batch; dispatch at least one row to every data-parallel rank"
        )
    parts = [list(p) for p in parts]
    while len(parts) < count:
        largest = max(range(len(parts)), key=lambda k: len(parts[k]))
        if len(parts[largest]) < 2:
            break
        rows = parts.pop(largest)
        half = len(rows) // 2
        parts[largest:largest] = [rows[:half], rows[half:]]
    out = [MicroBatch(tuple(p)) for p in parts]
    out += [MicroBatch((0,), dummy=True)] * (count - len(out))
    return out


@attrs.frozen
class ModelInputs:
    """One micro-batch laid out for the model.

    ``input_ids``/``position_ids [b, T]`` with ``attention_mask [b, T]``, or ``[1, N]`` packed with
    ``attention_mask`` None; ``index [M]`` flat positions whose hidden states the head reads and
    ``targets [M]`` the tokens they predict; ``response_valid [b, R]`` where the ``M`` per-token results
    go, and ``response_index [M]`` the same as flat positions into ``b*R`` (both None for the score
    head, whose ``M = b`` results are one per row). Packed inputs also carry
    ``cu_seq_lens [n+1]`` (int32: where each of the ``n`` sequences starts, then ``N``) and
    ``max_length``, the longest sequence (a Python int, so the attention kernel needs no device sync).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    index: torch.Tensor
    targets: torch.Tensor
    response_valid: torch.Tensor | None
    response_index: torch.Tensor | None = None
    cu_seq_lens: torch.Tensor | None = None
    max_length: int | None = None
    #: A vision-language model's image inputs (``pixel_values``, ``image_grid_thw``, ``mm_token_type_ids``
    #: laid out as ``input_ids``); ``position_ids`` is then ``[3, b, T]`` (M-RoPE), or ``[4, 1, N]`` packed
    #: (the text positions first, which mark where each sequence starts).
    extra: dict[str, torch.Tensor] | None = None

    def to(self, device: torch.device, pin: bool = False) -> ModelInputs:
        """On ``device`` (see :func:`to_device` for ``pin``)."""
        moved = [
            to_device(t, device, pin) if isinstance(t, torch.Tensor) else t
            for t in attrs.astuple(self, recurse=False)
        ]
        if self.extra is not None:
            moved[-1] = {k: to_device(v, device, pin) for k, v in self.extra.items()}
        return ModelInputs(*moved)

    def model_kwargs(self) -> dict[str, torch.Tensor | int | None]:
        return {
            "input_ids": self.input_ids,
            "position_ids": self.position_ids,
            "attention_mask": self.attention_mask,
            "index": self.index,
            "targets": self.targets,
            "cu_seq_lens": self.cu_seq_lens,
            "max_length": self.max_length,
            **(self.extra or {}),
        }


def _field(batch: Batch, key: str) -> torch.Tensor:
    if key not in batch.tensors:
        raise KeyError(f"the FSDP engine needs batch tensor {key!r}; the batch has {sorted(batch.tensors)}")
    return batch.tensors[key]


def token_costs(batch: Batch, packed: bool) -> list[int]:
    """Tokens each row adds to a micro-batch: its real tokens when packed, the padded width otherwise
    (an upper bound: :func:`build_inputs` then cuts columns that are padding in every row)."""
    mask = _field(batch, "attention_mask")
    if packed:
        return mask.sum(-1).tolist()
    return [mask.shape[1]] * mask.shape[0]


def build_inputs(
    batch: Batch, head: str, packed: bool, anchor: bool = False, vision: VisionLayout | None = None
) -> ModelInputs:
    """Model inputs for ``batch``. Prompts are left-padded and responses right-padded (``R`` =
    ``responses.shape[1]``); the hidden state at position ``P-1+j`` predicts (and values) response token
    ``j``. The score head reads each row's last real token.

    ``anchor`` appends one more position (the first real token) whose result the engine adds to the loss
    times zero, so every parameter takes part in every backward whatever the loss function reads.
    ``vision``: a vision-language model's layout (:mod:`rlcore_fsdp.vision`): M-RoPE positions for every
    row, and the rows' image inputs.
    """
    input_ids = _field(batch, "input_ids")
    mask = _field(batch, "attention_mask").bool()
    position_ids = _field(batch, "position_ids")
    b, T = input_ids.shape
    if not bool(mask.any(-1).all()):
        row = int((~mask.any(-1)).nonzero()[0])
        raise ValueError(f"row {row} of the batch has no real token (attention_mask is all zero)")
    flat_index = torch.arange(b * T).view(b, T)

    response_valid = response_index = None
    if head == "score":
        last = (mask.long() * torch.arange(T)).argmax(-1)  # [b] last real token per row
        index = flat_index[torch.arange(b), last]
        targets = input_ids[torch.arange(b), last]
    else:
        R = _field(batch, "responses").shape[1]
        P = T - R
        if P < 1:
            raise ValueError(f"input_ids [{b}, {T}] leave no prompt before responses [{b}, {R}]")
        response_valid = mask[:, P:]
        rows, cols = response_valid.nonzero(as_tuple=True)
        before = mask[rows, P - 1 + cols]
        if not bool(before.all()):
            k = int((~before).nonzero()[0])
            raise ValueError(
                f"row {int(rows[k])}: response token {int(cols[k])} follows a padding position; prompts must "
                "be left-padded and responses right-padded, with at least one prompt token"
            )
        index = flat_index[rows, P - 1 + cols]
        targets = input_ids[rows, P + cols]
        response_index = rows * R + cols
    if anchor:
        first = int(mask.reshape(-1).nonzero()[0])
        index = torch.cat([index, torch.tensor([first])])
        targets = torch.cat([targets, input_ids.reshape(-1)[first : first + 1]])

    images = None
    if vision is not None:
        R = batch.tensors["responses"].shape[1] if "responses" in batch.tensors else 0
        images = vision(batch, T - R)

    if not packed:
        # Columns that are padding in every row carry no information: cut them off both ends.
        real_cols = mask.any(0).nonzero().flatten()
        lo, hi = int(real_cols[0]), int(real_cols[-1]) + 1
        index = (index // T) * (hi - lo) + (index % T - lo)
        cut = slice(lo, hi)
        extra = None
        if images is not None:
            rope, extra = images
            position_ids = rope  # [3, b, T]: the cut below applies to its last dimension
            if extra:
                extra = {**extra, "mm_token_type_ids": extra["mm_token_type_ids"][:, cut]}
        return ModelInputs(
            input_ids[:, cut],
            position_ids[..., cut],
            mask[:, cut].long(),
            index,
            targets,
            response_valid,
            response_index,
            extra=extra,
        )

    expected = mask.long().cumsum(-1) - 1
    bad = (position_ids != expected) & mask
    if bool(bad.any()):
        row = int(bad.any(-1).nonzero()[0])
        raise ValueError(
            f"fsdp.use_remove_padding needs position_ids counting 0, 1, 2, ... over each row's real tokens "
            f"(row {row} has {position_ids[row][mask[row]].tolist()}); packing marks sequence starts by the reset to 0"
        )
    keep = mask.reshape(-1)
    packed_pos = keep.long().cumsum(0) - 1  # flat padded position -> packed position
    lengths = mask.sum(-1)
    cu_seq_lens = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)
    positions = position_ids.reshape(-1)[keep].unsqueeze(0)  # [1, N]
    extra = None
    if images is not None:
        rope, extra = images
        # [4, 1, N]: the text positions first (they mark the sequence starts), then the three M-RoPE rows.
        positions = torch.cat([positions[None], rope.reshape(3, -1)[:, keep][:, None]], dim=0)
        if extra:
            extra = {**extra, "mm_token_type_ids": extra["mm_token_type_ids"].reshape(-1)[keep].unsqueeze(0)}
    return ModelInputs(
        input_ids.reshape(-1)[keep].unsqueeze(0),
        positions,
        None,
        packed_pos[index],
        targets,
        response_valid,
        response_index,
        cu_seq_lens,
        int(lengths.max()),
        extra,
    )

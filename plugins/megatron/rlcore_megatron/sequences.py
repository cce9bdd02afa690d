"""From rlcore's padded batch layout to what Megatron's GPT model computes on, and back.

rlcore batches are ``[B, P+R]``: prompts left-padded, responses right-padded, real tokens contiguous.
megatron-core's GPT model applies rotary positions ``0..s-1`` to every row and masks attention only
causally, so each row is shifted left until its first real token sits at position 0 (verl does the
same). Padding then trails the real tokens, where causal attention keeps it from influencing them, and
rotary positions equal the HF ``position_ids`` of the real tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch
from rlcore.api import Batch
from rlcore.api.batch import to_device as tensor_to_device
from rlcore.kernels.micro_batches import plan_micro_batches


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

    def to(self, device: torch.device, pin: bool = False) -> Aligned:
        """On ``device`` (``pin``: :func:`rlcore.api.batch.to_device`)."""
        tokens, lead, lengths = (
            tensor_to_device(t, device, pin) for t in (self.tokens, self.lead, self.lengths)
        )
        return Aligned(tokens=tokens, lead=lead, lengths=lengths, width=self.width)


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
    length = _aligned_length(int(lengths.max()) if b else 0, multiple)
    src = (torch.arange(length, device=input_ids.device) + lead[:, None]).clamp(max=width - 1)
    tokens = input_ids.gather(1, src)
    tokens = torch.where(torch.arange(length, device=input_ids.device) < lengths[:, None], tokens, 0)
    return Aligned(tokens=tokens, lead=lead, lengths=lengths, width=width)


@attrs.frozen
class Packed:
    """The rows of an :class:`Aligned` packed into one row, padding removed (``megatron.use_remove_padding``).

    ``tokens``/``position_ids [1, T]`` (positions restart at 0 per sequence), ``cu_seqlens [n+1]`` int32
    (row ``r`` starts at ``cu_seqlens[r]``) and the same on the host, ``cu_seqlens_host`` (what code that
    loops over sequences reads, so that no layer waits on the device to learn the lengths), ``max_seqlen``
    (host int). ``T`` is the real token count, or more when the pack is padded (an empty batch): the extra
    tokens form one more sequence, after the rows.
    """

    tokens: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    cu_seqlens_host: torch.Tensor

    def next_tokens(self) -> torch.Tensor:
        """``[1, T]``: the token each position predicts within its sequence (0 at a sequence's last
        position, as in the padded layout; those positions are unused)."""
        nxt = torch.zeros_like(self.tokens)
        nxt[:, :-1] = self.tokens[:, 1:]
        cu = self.cu_seqlens.long()
        last = self.tokens.shape[1] - 1  # always a sequence's end: empty sequences point there
        nxt[0, torch.where(cu[1:] > cu[:-1], cu[1:] - 1, last)] = 0
        return nxt

    def to(self, device: torch.device, pin: bool = False) -> Packed:
        """The device tensors on ``device`` (``pin``: :func:`rlcore.api.batch.to_device`);
        ``cu_seqlens_host`` stays where it is (the host)."""
        return Packed(
            tokens=tensor_to_device(self.tokens, device, pin),
            position_ids=tensor_to_device(self.position_ids, device, pin),
            # A copy even on a CPU: never the host tensor itself (pack() made cu_seqlens one already).
            cu_seqlens=tensor_to_device(self.cu_seqlens, device, pin),
            max_seqlen=self.max_seqlen,
            cu_seqlens_host=self.cu_seqlens_host,
        )

    def unpack(self, values: torch.Tensor, aligned: Aligned) -> torch.Tensor:
        """``values [1, T, ...]`` on packed positions -> ``[b, L, ...]`` on ``aligned`` positions (positions
        past a row's length hold values of other rows: :func:`restore` drops them). Differentiable."""
        length = aligned.tokens.shape[1]
        rows = aligned.lengths.shape[0]
        src = self.cu_seqlens[:rows, None].long() + torch.arange(length, device=values.device)
        return values[0][src.clamp(max=values.shape[1] - 1)]


def pack(aligned: Aligned) -> Packed:
    """Pack the real tokens of ``aligned``'s rows into one row (on a device: one sync, for the lengths)."""
    lengths = aligned.lengths
    device = aligned.tokens.device
    host = [0, *lengths.tolist()]
    cu_host = torch.tensor(host, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    total, longest = int(cu_host[-1]), max(host)
    cu = cu_host.to(device, copy=True)  # never the host copy itself, even on a CPU
    width = aligned.tokens.shape[1]
    keep = torch.arange(width, device=device) < lengths[:, None]
    # One nonzero for both gathers (a boolean index each would run its own); a real token's rotary
    # position is its column after left alignment.
    flat = keep.flatten().nonzero().squeeze(1)
    tokens = aligned.tokens.flatten().index_select(0, flat)
    positions = flat % width
    if total == 0:  # nothing real: one pad token as its own sequence keeps every shape non-empty
        tokens, positions = tokens.new_zeros(1), positions.new_zeros(1)
        cu, cu_host = torch.cat([cu, cu.new_ones(1)]), torch.cat([cu_host, cu_host.new_ones(1)])
        longest = 1
    return Packed(
        tokens=tokens[None],
        position_ids=positions[None],
        cu_seqlens=cu,
        max_seqlen=longest,
        cu_seqlens_host=cu_host,
    )


@attrs.frozen
class ResponseTokens:
    """Where a micro-batch's response tokens are predicted, so that the vocabulary head runs on those
    positions alone (the FSDP engine does the same): prompt positions' logits are never used, and at the
    benchmark's workload they were a quarter of the head's work.

    ``positions [M]``: flat positions of the model output (``[1, T]`` packed or ``[b, L]`` aligned, then
    flattened) whose hidden state predicts a response token; ``targets [M]`` those tokens; ``cells [N]``
    their flat places in ``[b, R]`` (``shape``), for the first ``N`` of the ``M`` results. A response token
    counts when it is real and follows a real token. ``M = N`` unless no token counts: then ``M = 1``, one
    position whose result enters the output times zero, so that the head's weight still takes part in the
    backward (megatron-core's overlapped gradient reduction waits for every parameter's gradient).
    """

    positions: torch.Tensor
    targets: torch.Tensor
    cells: torch.Tensor
    shape: tuple[int, int]

    def to(self, device: torch.device, pin: bool = False) -> ResponseTokens:
        """On ``device`` (``pin``: :func:`rlcore.api.batch.to_device`)."""
        positions, targets, cells = (
            tensor_to_device(t, device, pin) for t in (self.positions, self.targets, self.cells)
        )
        return ResponseTokens(positions=positions, targets=targets, cells=cells, shape=self.shape)

    def place(self, values: torch.Tensor) -> torch.Tensor:
        """``values [M]`` (one per position) -> ``[b, R]``, 0 where no response token counts.
        Differentiable."""
        n = self.cells.shape[0]
        out = values.new_zeros(self.shape[0] * self.shape[1]).index_copy(0, self.cells, values[:n])
        if values.shape[0] > n:  # the stand-in position: in the graph, not in the values
            out = out + 0.0 * values[n:].sum()
        return out.view(self.shape)


def response_tokens(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    aligned: Aligned,
    packed: Packed | None,
) -> ResponseTokens:
    """:class:`ResponseTokens` of ``input_ids [b, S]`` whose last ``response_length`` columns are the
    responses, for the model output laid out as ``aligned`` (or ``packed``). Run it on the host: it
    reads the mask."""
    mask = attention_mask.bool()
    b, width = mask.shape
    first = width - response_length  # the column of response token 0
    # Whether the column before each response token is real: slices, not indexing (this runs for every
    # micro-batch while the device waits for its first inputs).
    real_before = mask[:, max(first - 1, 0) : max(width - 1, 0)]
    if first == 0 and response_length:  # no prompt column: response token 0 has no predecessor
        real_before = torch.cat([mask.new_zeros(b, 1), real_before], 1)
    rows, j = (mask[:, first:] & real_before).nonzero(as_tuple=True)
    at = first - 1 + j - aligned.lead[rows]  # the predicting position's column after left alignment
    if packed is None:
        positions = rows * aligned.tokens.shape[1] + at
    else:
        positions = packed.cu_seqlens_host.to(rows.device)[rows].long() + at
    targets = input_ids[rows, first + j]
    cells = rows * response_length + j
    if cells.numel() == 0:
        positions, targets = positions.new_zeros(1), targets.new_zeros(1)
    return ResponseTokens(positions=positions, targets=targets, cells=cells, shape=(b, response_length))


def input_shape(lengths: Sequence[int], multiple: int = 1, packed: bool = False) -> tuple[int, int]:
    """The shape of the token ids :func:`to_device` gives the model for rows of ``lengths`` real tokens
    (``[1, T]`` packed, ``[b, L]`` aligned), from the lengths alone: a step plans its pipeline hand-offs
    before it builds any micro-batch's inputs."""
    if packed:
        return 1, max(sum(lengths), 1)
    return len(lengths), _aligned_length(max(lengths, default=0), multiple)


def _aligned_length(longest: int, multiple: int) -> int:
    """The width of left-aligned rows whose longest has ``longest`` real tokens: at least 1 (every shape
    non-empty), rounded up to ``multiple``."""
    return -(-max(longest, 1) // multiple) * multiple


def to_device(
    batch: Batch,
    device: torch.device,
    multiple: int = 1,
    packed: bool = False,
    pin: bool = False,
    responses: bool = False,
) -> tuple[Batch, Aligned, Packed | None, ResponseTokens | None]:
    """One micro-batch's tensors and model inputs on ``device``: :func:`left_align` (and :func:`pack`,
    and with ``responses`` :func:`response_tokens`, for a head that reads only those positions) run where
    ``batch`` is (the host, as the controller sends it), and their results are moved. Their mask check,
    longest row and lengths are host values there; on a GPU each was a sync (three per micro-batch).
    ``pin`` (with an accelerator) also makes the copies asynchronous: from pageable memory each would
    wait for the device."""
    aligned = left_align(batch["input_ids"], batch["attention_mask"], multiple)
    packed_rows = pack(aligned) if packed else None
    response = None
    if responses and "responses" in batch:
        response = response_tokens(
            batch["input_ids"], batch["attention_mask"], batch["responses"].shape[1], aligned, packed_rows
        )
        response = response.to(device, pin)
    packed_rows = packed_rows.to(device, pin) if packed else None
    return batch.to(device, pin), aligned.to(device, pin), packed_rows, response


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


def micro_batch_rows(
    lengths: list[int], size: int, max_tokens: int | None = None, packed: bool = False
) -> list[list[int]]:
    """The row numbers of each micro-batch, for rows of ``lengths`` real tokens.

    Without ``max_tokens``: consecutive groups of ``size`` rows. Padded, with ``max_tokens``: consecutive
    rows while ``rows * longest_real_length <= max_tokens``. Packed (``sum of real lengths <=
    max_tokens``): token-balanced, as the FSDP engine plans them (:func:`rlcore.kernels.micro_batches.plan_micro_batches`:
    as few micro-batches as first-fit decreasing needs, the rows then spread longest first over them so
    their loads differ by at most one row), so the micro-batches hold rows out of order. A row longer
    than ``max_tokens`` goes alone either way.
    """
    if max_tokens is None:
        return plan_micro_batches(lengths, size, None)
    if packed:
        alone = [[i] for i, n in enumerate(lengths) if n > max_tokens]
        rest = [i for i, n in enumerate(lengths) if n <= max_tokens]
        planned = plan_micro_batches([lengths[i] for i in rest], 1, max_tokens) if rest else []
        return sorted(alone + [[rest[j] for j in rows] for rows in planned])
    pieces, start, longest = [], 0, 0
    for i, n in enumerate(lengths):
        longest_with = max(longest, n)
        if i > start and (i - start + 1) * longest_with > max_tokens:
            pieces.append(list(range(start, i)))
            start, longest_with = i, n
        longest = longest_with
    if lengths:
        pieces.append(list(range(start, len(lengths))))
    return pieces


def micro_batches(
    batch: Batch, size: int, max_tokens: int | None = None, packed: bool = False
) -> list[Batch]:
    """``batch`` split as :func:`micro_batch_rows` plans it (each micro-batch's rows in batch order)."""
    rows = micro_batch_rows(batch["attention_mask"].sum(1).tolist(), size, max_tokens, packed)
    return [batch.index(r) for r in rows]


def split_to_count(rows: list[list[int]], lengths: list[int], count: int) -> list[list[int]]:
    """``rows`` (a micro-batch plan over rows of ``lengths`` tokens) cut into ``count`` micro-batches where
    its rows allow: the micro-batch of most tokens that holds two rows or more is halved (its rows dealt
    longest first onto the lighter half) until there are ``count`` or no micro-batch has two rows left.

    Why: with expert parallelism every MoE layer exchanges tokens with the other data-parallel ranks, so
    all of them must run the same number of micro-batches; each rank plans its own shard, then all go to
    the largest count (:meth:`MegatronEngine._split`). Fewer than ``count`` come back only when the rank has
    fewer rows than that; the engine fills the rest with ghost micro-batches."""
    rows = [list(r) for r in rows]
    while len(rows) < count:
        splittable = [r for r in rows if len(r) > 1]
        if not splittable:
            break
        biggest = max(splittable, key=lambda r: sum(lengths[i] for i in r))
        halves: tuple[list[int], list[int]] = ([], [])
        for i in sorted(biggest, key=lambda i: -lengths[i]):
            lighter = min(halves, key=lambda h: (sum(lengths[j] for j in h), len(h)))
            lighter.append(i)
        at = rows.index(biggest)
        rows[at : at + 1] = [sorted(halves[0]), sorted(halves[1])]
    return rows

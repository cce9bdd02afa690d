"""Ulysses sequence parallelism (``fsdp.sequence_parallel_size``), as verl's ``ulysses_sequence_parallel_size``.

The world of ``dp * sp`` ranks is cut into data-parallel groups of ``sp`` consecutive ranks. The ranks of
one group hold the same rows (the controller sends them the same shard: :meth:`FSDPEngine.dp_rank_and_size`)
and so run the same packed micro-batches ``[1, N]``; FSDP2 still shards the parameters over all ranks.
What the group splits is the token row:

======================  =======================================================  ============================
step                    what each rank of the group holds                        where
======================  =======================================================  ============================
:func:`shard_inputs`    tokens ``[s*C, (s+1)*C)`` of the row padded to           before the forward
                        ``sp * C``, their global ``position_ids`` (rotary is
                        applied to the slice), the head positions in it with
                        the targets paired with them on the whole row
embeddings, MLP, norms  ``[C, hidden]``: every layer but attention is per token  the backbone
attention               q/k/v ``[C, H, D]`` -> :func:`seq_to_heads` ->           :mod:`rlcore_fsdp.attention`
                        ``[sp*C, H/sp, D]``: the whole row for ``H/sp`` heads,
                        var-len attention with the whole row's ``cu_seq_lens``,
                        then :func:`heads_to_seq` back to ``[C, H, D]``
head                    log-probs / entropy / values at its own positions        :class:`HeadedModel`
:func:`gather_slots`    all ``M`` results, identical on every rank of the group  after the forward
======================  =======================================================  ============================

The targets need no shifting per slice: :func:`rlcore_fsdp.micro_batches.build_inputs` pairs each head
position with the token it predicts on the whole row, so the last position of a slice keeps the first
token of the next slice as its target. The ``sp*C - N`` padding tokens form one extra sequence at the end
of ``cu_seq_lens``, so no real token attends to them.

Gradients: the loss function runs on the gathered ``[M]`` results, the same on every rank of the group;
:func:`gather_slots`' backward hands each rank the gradient of its own positions only. Each token's
gradient thus enters the sum FSDP2 forms over all ranks once, and the loss keeps dividing by the global
token count of the mini-batch, as without sequence parallelism.
"""

from __future__ import annotations

import attrs
import torch
import torch.distributed as dist

from rlcore_fsdp.micro_batches import ModelInputs


@attrs.frozen
class SequenceParallel:
    """This rank's sequence-parallel group: ``size`` consecutive ranks; ``rank`` is its place in it."""

    group: dist.ProcessGroup
    rank: int
    size: int


def new_group(size: int) -> SequenceParallel:
    """Split the default group into groups of ``size`` consecutive ranks (collective: every rank calls it)."""
    group, _ = dist.new_subgroups(group_size=size)
    return SequenceParallel(group, dist.get_rank(group), size)


def check_heads(config, size: int) -> None:
    """Refuse a model whose attention heads cannot be split over ``size`` ranks (``config``: the HF text config).

    Query heads must divide evenly; key/value heads too, or, when there are fewer than ``size``, ``size``
    must be a multiple of them (each is then repeated to one per rank, as verl does)."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if heads % size or (kv_heads % size and size % kv_heads):
        raise ValueError(
            f"fsdp.sequence_parallel_size={size} must divide the model's attention heads "
            f"(num_attention_heads={heads}) and its key/value heads (num_key_value_heads={kv_heads}), or be "
            "a multiple of the key/value heads; choose a size that does"
        )


# gloo has all_to_all_single on the CPU (checked with torch 2.13), so every backend takes one exchange;
# no all_gather-and-slice fallback is needed.
@torch.compiler.disable
def _exchange(x: torch.Tensor, group: dist.ProcessGroup, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Cut ``x`` in ``size`` pieces along ``scatter_dim``, send piece ``j`` to rank ``j`` of ``group``, and
    join the pieces received, in rank order, along ``gather_dim``."""
    size = dist.get_world_size(group)
    send = torch.stack(x.chunk(size, dim=scatter_dim))  # [size, ...], contiguous
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return torch.cat(received.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """:func:`_exchange`, whose backward is the inverse exchange of the gradient."""

    @staticmethod
    def forward(ctx, x, group, scatter_dim, gather_dim):
        ctx.group, ctx.dims = group, (scatter_dim, gather_dim)
        return _exchange(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _exchange(grad, ctx.group, gather_dim, scatter_dim), None, None, None


def seq_to_heads(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """``[C, H, D]`` (this rank's tokens, all heads) -> ``[sp*C, H/sp, D]`` (every rank's tokens in rank
    order, this rank's heads ``[s*H/sp, (s+1)*H/sp)``)."""
    return _AllToAll.apply(x, sp.group, 1, 0)


def heads_to_seq(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """The inverse of :func:`seq_to_heads`: ``[sp*C, H/sp, D]`` -> ``[C, H, D]``."""
    return _AllToAll.apply(x, sp.group, 0, 1)


class _SumOverGroup(torch.autograd.Function):
    """All-reduce (sum) forward; identity backward. For inputs that are zero outside each rank's own
    entries, feeding a loss that every rank of the group computes alike: each rank's gradient is then
    already the whole one, and the caller's scatter keeps its own entries of it."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def gather_slots(local: torch.Tensor, slots: torch.Tensor, total: int, sp: SequenceParallel) -> torch.Tensor:
    """``local [m]``, this rank's results for entries ``slots [m]`` of ``total`` -> all ``[total]`` results,
    identical on every rank of the group. Exact (each entry is one rank's value plus zeros)."""
    placed = local.new_zeros(total).index_copy(0, slots, local)
    return _SumOverGroup.apply(placed, sp.group)


def shard_inputs(
    inputs: ModelInputs, sp: SequenceParallel, anchor: bool
) -> tuple[ModelInputs, torch.Tensor, int]:
    """This rank's slice of a packed micro-batch (on the host), and where its results go.

    Returns ``(local, slots, total)``: ``local`` holds tokens ``[s*C, (s+1)*C)`` of the row padded to
    ``sp*C`` (``input_ids``/``position_ids [1, C]``; ``cu_seq_lens`` and ``max_length`` of the whole padded
    row, which attention sees after :func:`seq_to_heads`) and, of the ``total`` head positions, the ``m``
    in the slice (``index`` local, ``targets`` as paired on the whole row); ``slots [m]`` their places in
    ``[total]`` (:func:`gather_slots`). ``response_valid``/``response_index`` stay whole.

    ``anchor``: ``inputs`` ends with the engine's anchor position (see ``build_inputs``), which is replaced
    by one of the slice's own (its first token): every rank's head then takes part in every backward.
    """
    if inputs.cu_seq_lens is None:
        raise ValueError("fsdp.sequence_parallel_size > 1 needs packed inputs (fsdp.use_remove_padding=true)")
    ids, positions, cu_seq_lens = inputs.input_ids, inputs.position_ids, inputs.cu_seq_lens
    n = ids.shape[1]
    pad = -n % sp.size
    max_length = inputs.max_length
    if pad:
        ids = torch.cat([ids, ids.new_zeros(1, pad)], 1)
        positions = torch.cat([positions, torch.arange(pad, dtype=positions.dtype)[None]], 1)
        cu_seq_lens = torch.cat([cu_seq_lens, cu_seq_lens.new_tensor([n + pad])])
        max_length = max(max_length, pad)
    chunk = (n + pad) // sp.size
    lo, hi = sp.rank * chunk, (sp.rank + 1) * chunk
    index, targets = inputs.index, inputs.targets
    if anchor:
        index, targets = index[:-1], targets[:-1]
    slots = ((index >= lo) & (index < hi)).nonzero().flatten()
    local_index, local_targets = index[slots] - lo, targets[slots]
    if anchor:
        local_index = torch.cat([local_index, local_index.new_zeros(1)])
        local_targets = torch.cat([local_targets, ids[0, lo : lo + 1].to(local_targets.dtype)])
    local = ModelInputs(
        ids[:, lo:hi],
        positions[:, lo:hi],
        None,
        local_index,
        local_targets,
        inputs.response_valid,
        inputs.response_index,
        cu_seq_lens,
        max_length,
    )
    return local, slots, len(index)

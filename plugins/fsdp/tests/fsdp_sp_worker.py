"""One rank of the 2-process gloo run in ``test_sequence_parallel.py`` (started with torch.multiprocessing).

Both ranks form one sequence-parallel group (``fsdp.sequence_parallel_size=2``, one data-parallel rank),
so each gets the whole of :func:`fsdp_support.batch` (and only rank 0 returns ``infer`` results). A rank first runs the exchange, the gather and the
attention on plain tensors, then trains and infers with lm, value and score engines, and saves what it
saw to ``OUT/rank{r}.pt``; the test compares it with one-process engines and plain references.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from fsdp_support import STEPS, batch, full_weights, nll_entropy_loss, spec
from rlcore.api import DistInfo
from rlcore.devices import get_platform
from rlcore.testing.contract import value_mse_loss
from rlcore_fsdp.attention import SP_KWARG, varlen_attention_forward
from rlcore_fsdp.config import FSDPConfig
from rlcore_fsdp.engine import FSDPEngine, init_process_group
from rlcore_fsdp.sequence_parallel import gather_slots, heads_to_seq, new_group, seq_to_heads

SP = 2
#: The packed engine configuration every sequence-parallel engine here runs with.
CONFIG = dict(use_remove_padding=True, attn_implementation="varlen", sequence_parallel_size=SP)
#: Attention inputs: (query heads, key/value heads), 12 tokens in sequences of 5 and 7 (the second
#: straddles the two ranks' slices), head dim 8.
ATTENTION_HEADS = [(4, 2), (2, 1)]
ATTENTION_BOUNDS = [0, 5, 12]


def attention_inputs(heads: int, kv_heads: int) -> list[torch.Tensor]:
    """The whole row's ``query [1, H, 12, 8]``, ``key``/``value [1, Hkv, 12, 8]`` (float64) and the
    output cotangent ``[1, 12, H, 8]``, the same on every rank and in the test."""
    g = torch.Generator().manual_seed(heads)
    n = ATTENTION_BOUNDS[-1]
    shapes = [(1, heads, n, 8), (1, kv_heads, n, 8), (1, kv_heads, n, 8), (1, n, heads, 8)]
    return [torch.randn(s, dtype=torch.float64, generator=g) for s in shapes]


def collectives(rank: int, sp) -> dict:
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(3, 4, 5, dtype=torch.float64, generator=g, requires_grad=True)  # [C, H, D]
    y = seq_to_heads(x, sp)
    cotangent = torch.randn(y.shape, dtype=torch.float64, generator=g)
    (grad,) = torch.autograd.grad(y, x, cotangent)
    back = heads_to_seq(y, sp)
    exchange = {"x": x.detach(), "y": y.detach(), "cotangent": cotangent, "grad": grad, "back": back.detach()}

    # Rank r holds entries r, r+2, r+4 of 6; every rank's loss reads the gathered vector alike.
    local = torch.randn(3, dtype=torch.float64, generator=g, requires_grad=True)
    slots = torch.arange(rank, 6, SP)
    gathered = gather_slots(local, slots, 6, sp)
    weights = torch.arange(1.0, 7.0, dtype=torch.float64)
    (local_grad,) = torch.autograd.grad((gathered * weights).sum(), local)
    gather = {"local": local.detach(), "gathered": gathered.detach(), "grad": local_grad}

    attention = {}
    chunk = ATTENTION_BOUNDS[-1] // SP
    for heads, kv_heads in ATTENTION_HEADS:
        q, k, v, cotangent = attention_inputs(heads, kv_heads)
        mine = [t[:, :, rank * chunk : (rank + 1) * chunk].clone().requires_grad_() for t in (q, k, v)]
        out, _ = varlen_attention_forward(
            None,
            *mine,
            None,
            scaling=0.3,
            cu_seq_lens_q=torch.tensor(ATTENTION_BOUNDS, dtype=torch.int32),
            max_length_q=7,
            **{SP_KWARG: sp},
        )
        grads = torch.autograd.grad(out, mine, cotangent[:, rank * chunk : (rank + 1) * chunk])
        attention[heads, kv_heads] = {"out": out.detach(), "grads": grads}
    return {"exchange": exchange, "gather": gather, "attention": attention}


def tensors(result):
    """An ``infer`` result's tensors; None on the ranks that return none."""
    return None if result is None else result.tensors


def run(rank: int, world: int, port: int, model_path: str, out: str) -> None:
    torch.set_num_threads(1)
    info = DistInfo(rank=rank, world_size=world, local_rank=rank, master_port=port)
    platform = get_platform("cpu")
    init_process_group(platform, info)
    saved = collectives(rank, new_group(SP))
    data = batch()

    # lm: several token-budget micro-batches (odd lengths get padded), recomputed in the backward.
    overrides = dict(dtype="float64", max_tokens_per_micro_batch=8, gradient_checkpointing=True)
    engine = FSDPEngine(spec(model_path, **overrides), FSDPConfig(**CONFIG), platform, info)
    saved["dp"] = engine.dp_rank_and_size(), engine.holds_output()
    saved["lm_metrics"] = [engine.train_step(data, nll_entropy_loss) for _ in range(STEPS)]
    saved["lm_infer"] = tensors(engine.infer(data, ["log_probs", "entropy"]))
    saved["lm_weights"] = full_weights(engine)

    critic = FSDPEngine(spec(model_path, head="value", dtype="float64"), FSDPConfig(**CONFIG), platform, info)
    saved["values"] = tensors(critic.infer(data, ["values"]))
    saved["value_metrics"] = critic.train_step(data, value_mse_loss)
    saved["value_weights"] = {
        n: t
        for n, t in full_weights(critic).items()
        if n.startswith("score") or n.endswith("layers.0.mlp.up_proj.weight")
    }

    reward = FSDPEngine(spec(model_path, head="score"), FSDPConfig(**CONFIG), platform, info)
    saved["scores"] = tensors(reward.infer(data, ["scores"]))

    torch.save(saved, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()

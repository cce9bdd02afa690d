"""Data, loss and float64 references shared by rlcore-fsdp's tests (importable from the spawned ranks)."""

from __future__ import annotations

import socket

import torch
from rlcore.api import Batch, EngineSpec
from rlcore.testing.contract import contract_batch
from rlcore.weights import assemble

STEPS = 3
ENTROPY_COEF = 0.01
#: FSDPConfig / EngineSpec changes per variant of the 2-rank run. The float64 ones must reproduce the
#: one-process float64 engine tightly; ``fp32`` is compared with float32 tolerances.
VARIANTS = {
    "padded": ({}, {"dtype": "float64"}),
    "packed": (
        {"use_remove_padding": True, "recompute_logits": False},
        {"dtype": "float64", "max_tokens_per_micro_batch": 16},
    ),
    "offload": ({"cpu_offload": True}, {"dtype": "float64"}),
    "reduce-once": (
        {"reduce_grads_once_per_step": True, "reshard_after_forward": False},
        {"dtype": "float64"},
    ),
    "fp32": ({}, {}),
}


def free_port() -> int:
    """A TCP port free on this host now, for a spawned run's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def batch() -> Batch:
    """7 rows: shards of 4 and 3 rows, so ranks need different micro-batch splits."""
    return contract_batch(7, vocab_low=3, vocab_high=1000, seed=5)


def spec(model_path: str, **overrides) -> EngineSpec:
    fields = dict(
        model_path=model_path, lr=1e-3, weight_decay=0.01, grad_clip=1.0, micro_batch_size=3, temperature=0.8
    )
    return EngineSpec(**{**fields, **overrides})


def nll_entropy_loss(outputs: dict[str, torch.Tensor], micro: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    """Token NLL minus an entropy bonus, summed over tokens and divided by the global token count."""
    mask = micro["response_mask"].to(outputs["log_probs"].dtype)
    total = micro.meta["global_tokens"]
    nll = -(outputs["log_probs"] * mask).sum() / total
    entropy = (outputs["entropy"] * mask).sum() / total
    return nll - ENTROPY_COEF * entropy, {"entropy": float(entropy.detach())}


def full_weights(engine) -> dict[str, torch.Tensor]:
    """The engine's weights through its weight stream (small buckets split big tensors), in float64."""
    stream = engine.export_weights(torch.float64, 1 << 16)
    return {name: t.detach().cpu().clone() for name, t in assemble(stream)}


def row_log_probs(model, batch: Batch, i: int, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropy (float64) of row ``i``'s real response tokens from a plain HF causal LM
    run on that row alone, without padding."""
    mask = batch["attention_mask"][i].bool()
    n_prompt = int(mask[: mask.shape[0] - batch["responses"].shape[1]].sum())
    ids = batch["input_ids"][i][mask]
    logits = model(ids[None].long()).logits[0].double() / temperature
    logp = torch.log_softmax(logits, -1)
    pos = torch.arange(n_prompt - 1, ids.shape[0] - 1)
    return logp[pos, ids[pos + 1]], -(logp[pos].exp() * logp[pos]).sum(-1)


def hf_reference(model, batch: Batch, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropy ``[B, R]`` (float64, zero at padding) from a plain HF causal LM, one row at
    a time without any padding: the independent reference for the engine's ``infer``."""
    R = batch["responses"].shape[1]
    log_probs = torch.zeros(len(batch), R, dtype=torch.float64)
    entropy = torch.zeros(len(batch), R, dtype=torch.float64)
    with torch.no_grad():
        for i in range(len(batch)):
            lp, ent = row_log_probs(model, batch, i, temperature)
            log_probs[i, : lp.shape[0]], entropy[i, : ent.shape[0]] = lp, ent
    return log_probs, entropy


def train_reference(
    model, batch: Batch, spec: EngineSpec, lr_factors: list[float]
) -> tuple[dict, list[dict]]:
    """What the engine's ``train_step`` with :func:`nll_entropy_loss` must do, as a plain loop over rows
    of a float64 HF model: summed per-row gradients, global clipping, AdamW at ``spec.lr * factor``."""
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=spec.lr, betas=spec.betas, weight_decay=spec.weight_decay
    )
    total = batch.meta["global_tokens"]
    metrics = []
    for factor in lr_factors:
        loss_sum = 0.0
        for i in range(len(batch)):
            lp, ent = row_log_probs(model, batch, i, spec.temperature)
            loss = (-lp.sum() - ENTROPY_COEF * ent.sum()) / total
            loss.backward()
            loss_sum += float(loss.detach())
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
        for group in optimizer.param_groups:
            group["lr"] = spec.lr * factor
        optimizer.step()
        optimizer.zero_grad()
        metrics.append({"loss": loss_sum, "grad_norm": float(norm), "lr": spec.lr * factor})
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, metrics


def score_loss(outputs: dict[str, torch.Tensor], micro: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    """Squared error of each sequence's score against ``score_targets``, per global sequence."""
    err = (outputs["scores"] - micro["score_targets"].to(outputs["scores"].dtype)) ** 2
    return err.sum() / micro.meta["global_sequences"], {}

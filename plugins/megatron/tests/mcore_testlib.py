"""Helpers shared by the megatron tests and their spawned workers: batches, loss functions, the
process spawner and Hugging Face references (independent of Megatron: plain transformers + torch)."""

from __future__ import annotations

import copy
import os
import socket
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

#: Tolerance for fp32 log-probs, losses and values against HF (other kernels, other reduction orders).
ATOL = 1e-4


def assert_same_weights(ours: dict, theirs: dict, atol: float = 0.0) -> None:
    """Same names; every tensor equal (bit-exact unless ``atol``)."""
    assert set(ours) == set(theirs)
    for name, tensor in theirs.items():
        torch.testing.assert_close(ours[name], tensor, rtol=0, atol=atol, msg=name)


#: ``rlcore`` of this environment, and the site folder whose sitecustomize gives Ray workers the CPU
#: redirection of megatron-core (``cpu_site/sitecustomize.py``).
RLCORE = Path(sys.executable).with_name("rlcore")
CPU_SITE = Path(__file__).parent / "cpu_site"


def megatron_cpu_env(tmp_path: Path) -> dict[str, str]:
    """The environment of an ``rlcore train --engine megatron`` run on this CPU (the test redirect on, its
    own cache, a fresh local Ray cluster)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(CPU_SITE), os.environ.get("PYTHONPATH", "")]),
        "RLCORE_TEST_MEGATRON_ON_CPU": "1",
        "RLCORE_CACHE_DIR": str(tmp_path / "cache"),
        "COLUMNS": "200",
    }
    env.pop("RAY_ADDRESS", None)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(fn, nprocs: int, *args) -> None:
    """Run ``fn(rank, nprocs, port, *args)`` in ``nprocs`` fresh processes; re-raise a worker's error."""
    import torch.multiprocessing as mp

    mp.start_processes(fn, args=(nprocs, free_port(), *args), nprocs=nprocs, start_method="spawn")


def make_batch(seed: int, vocab: int, rows: int = 4, prompt: int = 6, response: int = 5):
    """Left-padded prompts + right-padded responses of varied lengths, as rlcore's rollout writes them."""
    from rlcore.api import Batch

    gen = torch.Generator().manual_seed(seed)
    prompt_lens = [prompt, prompt - 2, prompt - 1, 2][:rows]
    response_lens = [response, 2, response - 1, 3][:rows]
    prompts = torch.zeros(rows, prompt, dtype=torch.long)
    responses = torch.zeros(rows, response, dtype=torch.long)
    pmask = torch.zeros(rows, prompt, dtype=torch.long)
    rmask = torch.zeros(rows, response, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        prompts[i, prompt - p :] = torch.randint(3, vocab, (p,), generator=gen)
        pmask[i, prompt - p :] = 1
        responses[i, :r] = torch.randint(3, vocab, (r,), generator=gen)
        rmask[i, :r] = 1
    attention_mask = torch.cat([pmask, rmask], 1)
    return Batch(
        {
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
            "response_mask": rmask,
            "returns": torch.randn(rows, response, generator=gen),
        },
        meta={"global_tokens": int(rmask.sum())},
    )


def nll_loss(outputs, micro_batch):
    """Token-mean negative log-likelihood of the response, normalised by the global token count."""
    mask = micro_batch["response_mask"].to(outputs["log_probs"].dtype)
    loss = -(outputs["log_probs"] * mask).sum() / micro_batch.meta["global_tokens"]
    return loss, {"entropy": float((outputs["entropy"] * mask).sum() / mask.sum().clamp(min=1))}


def value_loss(outputs, micro_batch):
    """Token-mean squared error of the values against ``returns``."""
    mask = micro_batch["response_mask"].to(outputs["values"].dtype)
    err = (outputs["values"] - micro_batch["returns"].to(outputs["values"].dtype)) ** 2
    return (err * mask).sum() / micro_batch.meta["global_tokens"], {}


def hf_model(path, dtype=torch.float32):
    """The HF model at ``path`` for reference numbers. Mixtures of experts run their experts one by one
    (``experts_implementation="eager"``): transformers' grouped kernel has no float64."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = {}
    if getattr(AutoConfig.from_pretrained(str(path)), "model_type", "") in ("qwen3_moe", "mixtral"):
        kwargs["experts_implementation"] = "eager"
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, **kwargs).eval()


def hf_response_outputs(model, batch):
    """HF ``log p(response token)`` and entropy at each response position, ``[B, R]`` in float64."""
    width = batch["responses"].shape[1]
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
    ).logits
    logits = logits[:, -width - 1 : -1].double()
    logp = F.log_softmax(logits, -1)
    token_logp = logp.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return token_logp, entropy


def hf_train_step(model, batch, *, lr, betas, eps, weight_decay, grad_clip, extra_loss=None):
    """One AdamW step of ``nll_loss`` on a copy of ``model`` (weight decay on matrices only, like
    Megatron). ``extra_loss(outputs)``: a term added to the loss from the model's outputs, which then
    include the routers' logits (``output_router_logits``); the returned loss is the NLL alone.
    Returns ``(loss, grad_norm, {hf_name: tensor})`` with tied weights under both names."""
    model = copy.deepcopy(model).train()
    params = dict(model.named_parameters())
    groups = [
        {"params": [p for p in params.values() if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params.values() if p.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)
    width = batch["responses"].shape[1]
    outputs = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        **({"output_router_logits": True} if extra_loss is not None else {}),
    )
    logits = outputs.logits[:, -width - 1 : -1]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # a float64 model stays float64
    logp = F.log_softmax(logits, -1).gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    mask = batch["response_mask"].to(logp.dtype)
    loss = -(logp * mask).sum() / batch.meta["global_tokens"]
    (loss if extra_loss is None else loss + extra_loss(outputs)).backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    return (
        float(loss.detach()),
        float(grad_norm),
        {k: v.detach().clone() for k, v in model.state_dict().items()},
    )

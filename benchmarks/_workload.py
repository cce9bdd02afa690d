"""The training workload the engine benchmarks share (``fsdp_train.py``, ``megatron_gpu.py``), so their
rows measure exactly the same thing: the model shapes, the RL-like steps, the loss and the FLOP count.

Models are random-init Qwen2.5-shaped ``Qwen2Config``s (and one Qwen3-1.7B shape) built here (no download). A step is sequences of
``min_len..max_len`` real tokens (uniform) until ``tokens`` are reached, a quarter prompt (left-padded)
and the rest response (right-padded), as rlcore batches are laid out. The loss is the response-token
NLL divided by the step's global response-token count (rlcore's normalisation).

FLOPs are *model* FLOPs of the real (unpadded) tokens, the usual MFU convention, per step::

    FLOPs = 6 * N * T  +  6 * n_layers * d_attn * sum_s L_s**2

- ``N``: parameters of all matrix multiplications (attention q/k/v/o, MLP, and the output layer
  ``vocab x hidden`` once even when tied to the embedding, whose lookup costs nothing); ``6 * N`` per
  token is 2 (multiply-add) x 3 (forward + two backward matmuls).
- ``T = sum_s L_s``: real tokens of the step over all GPUs; ``L_s`` the length of sequence ``s``.
- Attention scores and the weighted sum of values each cost ``L**2 * d_attn / 2`` multiply-adds per
  layer under a causal mask (``d_attn = heads * head_dim``): ``2 * L**2 * d_attn`` FLOPs forward, times
  3 for training.
- Not counted: padding, activation recomputation (gradient checkpointing, the engine's chunked logits),
  norms, softmax, the optimizer.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import torch
from rlcore.api import Batch
from rlcore.cluster.balance import balanced_order

SHAPES = {
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
    ),
    "qwen2.5-1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
    ),
    "qwen2.5-7b": dict(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
    ),
    # Qwen3-1.7B (its head_dim 128 is hidden / heads, as for the Qwen2.5 shapes).
    "qwen3-1.7b": dict(
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
    ),
    # Qwen3-30B-A3B's layer shape with 4 of its 48 layers (fits one GPU with AdamW state: about 3B parameters,
    # 0.6B active per token with the embeddings), and with 8 (5.6B; 4 GPUs, each holding every expert at
    # EP=1 with the distributed optimizer, or a quarter of them at EP=4).
    **{
        f"qwen3-30b-a3b-{layers}l": dict(
            hidden_size=2048,
            intermediate_size=6144,
            num_hidden_layers=layers,
            num_attention_heads=32,
            num_key_value_heads=4,
        )
        for layers in (4, 8)
    },
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
}
VOCAB = {"tiny": 512, "qwen2.5-7b": 152064}
#: Shapes whose output layer is its own matrix (Qwen2.5-7B); the smaller ones tie it to the embedding.
MOE = ("qwen3-30b-a3b-4l", "qwen3-30b-a3b-8l")
UNTIED = {"qwen2.5-7b", *MOE}
#: Shapes of another family than Qwen2 (HF ``model_type``): Qwen3 has no q/k/v biases and normalises each
#: query and key head (q/k RMSNorm).
ARCHITECTURE = {"qwen3-1.7b": "qwen3", **dict.fromkeys(MOE, "qwen3_moe")}
#: Head sizes that are not hidden / heads.
HEAD_DIM = dict.fromkeys(MOE, 128)
#: Mixture-of-experts settings (Qwen3-30B-A3B's: 128 experts of 768, 8 per token, untied output layer).
EXPERTS = dict.fromkeys(
    MOE, dict(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True)
)


def model_config(name: str):
    """The HF config of the random model ``name`` (a key of :data:`SHAPES`)."""
    import transformers

    shape = SHAPES[name]
    family = ARCHITECTURE.get(name, "qwen2")
    cls = {
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "qwen3_moe": transformers.Qwen3MoeConfig,
    }[family]
    return cls(
        **shape,
        **EXPERTS.get(name, {}),
        vocab_size=VOCAB.get(name, 151936),
        head_dim=HEAD_DIM.get(name, shape["hidden_size"] // shape["num_attention_heads"]),
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        tie_word_embeddings=name not in UNTIED,
        rms_norm_eps=1e-6,
    )


def save_random_model(name: str, folder: Path, device: torch.device) -> Path:
    """A random-init causal LM of shape ``name`` saved in bf16 under ``folder/name`` (built on
    ``device``: fast); reused when already there."""
    from transformers import AutoModelForCausalLM

    path = folder / name
    if (path / "config.json").is_file():
        return path
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(model_config(name)).to(torch.bfloat16)
    model.save_pretrained(str(path))
    del model
    return path


def matmul_params(config) -> int:
    """``N`` of the FLOP formula: matrix-multiply parameters, output layer counted once; for a mixture of
    experts the ones a token uses (router and ``num_experts_per_tok`` experts: MFU on active parameters)."""
    h, layers = config.hidden_size, config.num_hidden_layers
    q = config.num_attention_heads * config.head_dim
    kv = config.num_key_value_heads * config.head_dim
    mlp = 3 * h * config.intermediate_size
    if getattr(config, "num_experts", None):  # active parameters: the router and the chosen experts
        mlp = h * config.num_experts + config.num_experts_per_tok * 3 * h * config.moe_intermediate_size
    per_layer = h * q + 2 * h * kv + q * h + mlp
    return layers * per_layer + config.vocab_size * h


def step_flops(config, lengths: list[int]) -> float:
    """Model FLOPs of one training step over sequences of ``lengths`` real tokens (module doc)."""
    d_attn = config.num_attention_heads * config.head_dim
    dense = 6 * matmul_params(config) * sum(lengths)
    attention = 6 * config.num_hidden_layers * d_attn * sum(n * n for n in lengths)
    return float(dense + attention)


def rl_batch(tokens: int, min_len: int, max_len: int, vocab: int, seed: int) -> tuple[Batch, list[int]]:
    """Sequences of ``min_len..max_len`` real tokens until ``tokens`` are reached, laid out as rlcore
    batches are (left-padded prompts, right-padded responses); returns the batch and the lengths."""
    g = torch.Generator().manual_seed(seed)
    lengths: list[int] = []
    while sum(lengths) < tokens:
        lengths.append(int(torch.randint(min_len, max_len + 1, (1,), generator=g)))
    prompt_lens = [max(1, n // 4) for n in lengths]
    P, R = max(prompt_lens), max(n - p for n, p in zip(lengths, prompt_lens, strict=True))
    input_ids = torch.zeros(len(lengths), P + R, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, (n, p) in enumerate(zip(lengths, prompt_lens, strict=True)):
        ids = torch.randint(3, vocab, (n,), generator=g)
        input_ids[i, P - p : P] = ids[:p]
        input_ids[i, P : P + n - p] = ids[p:]
        mask[i, P - p : P + n - p] = 1
    tensors = {
        "input_ids": input_ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
        "responses": input_ids[:, P:],
        "response_mask": mask[:, P:],
    }
    meta = {"global_tokens": int(mask[:, P:].sum()), "global_sequences": len(lengths)}
    return Batch(tensors, meta=meta), lengths


def shard(batch: Batch, world: int, rank: int) -> Batch:
    """This data-parallel rank's share of a step, split as rlcore's controller splits it (token-balanced)."""
    order = balanced_order(batch["attention_mask"].sum(-1).tolist(), world)
    return batch.index(order).chunk(world)[rank]


def nll_loss(outputs, micro):
    """Response-token NLL over the step's global response-token count (an rlcore ``LossFn``)."""
    mask = micro["response_mask"].to(outputs["log_probs"].dtype)
    return -(outputs["log_probs"] * mask).sum() / micro.meta["global_tokens"], {}


def reset_peak_memory() -> None:
    if torch.accelerator.is_available():
        torch.accelerator.reset_peak_memory_stats()


def peak_memory_gib(platform) -> float:
    """Peak allocated device memory since :func:`reset_peak_memory`; on a CPU the process RSS."""
    if torch.accelerator.is_available():
        return torch.accelerator.max_memory_allocated() / 2**30
    return platform.memory_stats()["allocated_gib"]


def host_threads(world: int) -> int:
    """Intra-op threads for each of ``world`` ranks: their share of ``BENCH_HOST_CPUS`` (the cores this run
    may use; default all of the host's). Two runs side by side on one host (the ``megatron-pair-*`` stages of ``python -m benchmarks.gpu``)
    set it to half each: with every process taking all cores, the host's OpenMP threads were oversubscribed
    two to one and the FSDP engine's per-micro-batch host indexing took 8 ms a call instead of well under
    one (2 x H200 profile, ``docs/benchmarks.md``)."""
    cpus = int(os.environ.get("BENCH_HOST_CPUS") or os.cpu_count() or 1)
    return max(1, cpus // world)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

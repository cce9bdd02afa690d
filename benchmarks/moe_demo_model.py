"""A random mixture-of-experts model with Qwen3-30B-A3B's layer shape that the built-in demo task can train.

``rlcore train``'s default task (copy_word) speaks the built-in tiny word-level tokenizer
(``rlcore.testing.tiny``). This writes that tokenizer and a random ``qwen3_moe`` model over its vocabulary
with the layer shape of ``benchmarks/_workload.py``'s ``qwen3-30b-a3b-<N>l`` (hidden 2048, 32 query / 4
key-value heads of 128, 128 experts of 768, 8 a token, untied output layer), in bf16, into one folder: what
issue 36's GPU rows point ``model.path`` at, the card's command with a Qwen3-MoE of that shape
(``python -m benchmarks.gpu plan sglang-train-moe-4gpu``). The vocabulary is the tokenizer's, not
Qwen3's 151,936: the layers are the shape under test, and the demo's rewards need its tokenizer.

    python benchmarks/moe_demo_model.py --layers 8 --out /tmp/moe-demo            # GPU: built on cuda
    python benchmarks/moe_demo_model.py --tiny --out /tmp/moe-demo-tiny          # CPU smoke: 2 small layers
"""

from __future__ import annotations

import argparse
from pathlib import Path

import _workload
import torch


def layer_shape(tiny: bool) -> dict:
    """``tiny_config``'s size arguments and the head width: ``_workload``'s Qwen3-30B-A3B layer shape (its
    heads are 128 wide, not hidden / heads), or small ones for the CPU smoke test."""
    if tiny:
        return dict(
            hidden_size=64,
            num_heads=4,
            num_kv_heads=2,
            intermediate_size=32,
            num_experts=8,
            num_experts_per_tok=2,
            head_dim=16,
        )
    ref = _workload.model_config("qwen3-30b-a3b-8l")
    return dict(
        hidden_size=ref.hidden_size,
        num_heads=ref.num_attention_heads,
        num_kv_heads=ref.num_key_value_heads,
        intermediate_size=ref.moe_intermediate_size,
        num_experts=ref.num_experts,
        num_experts_per_tok=ref.num_experts_per_tok,
        head_dim=ref.head_dim,
    )


def build(out: Path, layers: int, tiny: bool, device: str) -> Path:
    from rlcore.testing.tiny import build_tiny_tokenizer, causal_lm_class, tiny_config

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(out)
    shape = layer_shape(tiny)
    head_dim = shape.pop("head_dim")
    config = tiny_config(
        tokenizer,
        architecture="qwen3_moe",
        num_layers=layers,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
        **shape,
    )
    config.head_dim = head_dim  # tiny_config sets hidden / heads
    torch.manual_seed(0)
    with torch.device(device):
        model = causal_lm_class("qwen3_moe")(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(out))
    total = sum(p.numel() for p in model.parameters())
    print(f"qwen3_moe, {layers} layers, {total / 1e9:.2f}B parameters, vocabulary {config.vocab_size}: {out}")
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="CPU smoke: small dimensions, 2 layers")
    args = p.parse_args(argv)
    build(args.out, 2 if args.tiny else args.layers, args.tiny, args.device)


if __name__ == "__main__":
    main()

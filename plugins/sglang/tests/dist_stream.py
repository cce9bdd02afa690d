"""The model and weight streams of the ``sglang-distributed`` transport test, shared by the sender (the
test) and the receiver processes (``scheduler_worker.py``): a tiny Qwen2-like layout with tied
embeddings, and per sync a stream whose values come from a float64 reference."""

import torch
from rlcore.weights import WeightLayout

HIDDEN, VOCAB, FFN = 8, 16, 24
SHAPES = {
    "model.embed_tokens.weight": (VOCAB, HIDDEN),
    "model.layers.0.self_attn.q_proj.weight": (HIDDEN, HIDDEN),
    "model.layers.0.self_attn.q_proj.bias": (HIDDEN,),
    "model.layers.0.mlp.up_proj.weight": (FFN, HIDDEN),
    "model.layers.0.mlp.down_proj.weight": (HIDDEN, FFN),
    "model.norm.weight": (HIDDEN,),
    "lm_head.weight": (VOCAB, HIDDEN),
}
TIED = ("model.embed_tokens.weight", "lm_head.weight")
LAYOUT = WeightLayout("tiny-qwen2", SHAPES, {name: TIED for name in TIED})
#: What a complete stream loads, under SGLang's names (the tied pair once, as its first name).
LOADED = [name for name in SHAPES if name != "lm_head.weight"]


def reference(sync: int) -> dict[str, torch.Tensor]:
    """float64 values of every weight at sync ``sync`` (tied names share one tensor)."""
    generator = torch.Generator().manual_seed(1000 + sync)
    values = {
        name: torch.randn(shape, generator=generator, dtype=torch.float64) for name, shape in SHAPES.items()
    }
    values["lm_head.weight"] = values["model.embed_tokens.weight"]
    return values


def stream(sync: int, bad: str | None = None) -> list[list[tuple[str, torch.Tensor]]]:
    """The trainer's buckets of sync ``sync`` in float32, two tensors a bucket, the tied embedding sent
    under its ``lm_head`` name too; ``bad`` (a name) replaces the third tensor's name."""
    named = [(name, value.float()) for name, value in reference(sync).items()]
    if bad is not None:
        named[2] = (bad, named[2][1])
    return [named[i : i + 2] for i in range(0, len(named), 2)]

"""A tiny tokenizer and Qwen2 model built locally (no hub), for tests, demos and benchmarks.

The tokenizer is byte-level BPE trained in well under a second on generated text, with a Qwen-style
chat template; the model is a random-init ``Qwen2ForCausalLM`` (by default 2 layers, hidden 256, tied
embeddings, about 1.4M parameters) that loads in transformers, vLLM, FSDP and Megatron alike.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _corpus(n: int = 4000, seed: int = 0) -> list[str]:
    """Text covering what the built-in tasks and tests write: digits, arithmetic, chat roles, words."""
    rng = random.Random(seed)
    words = (
        "the a of and to in is what answer question compute add plus minus times sum total number "
        "user assistant system please solve step think so result equals final reasoning hello world "
        "count reverse sort list letters apple banana cherry model reward policy learn"
    ).split()
    lines = []
    for _ in range(n):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        lines.append(f"What is {a} + {b}? The answer is {a + b}. #### {a + b}")
        lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))))
        lines.append(f"user\n{rng.choice(words)} {a} {b}\nassistant\n\\boxed{{{a * b}}}")
    return lines


def build_tiny_tokenizer(path: str | os.PathLike | None = None, vocab_size: int = 1024):
    """Train a byte-level BPE tokenizer; return a ``PreTrainedTokenizerFast`` (saved to ``path`` if given)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    if path is not None:
        fast.save_pretrained(str(path))
    return fast


def build_tiny_model(
    path: str | os.PathLike,
    *,
    num_layers: int = 2,
    hidden_size: int = 256,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 512,
    max_position_embeddings: int = 2048,
    tie_word_embeddings: bool = True,
    seed: int = 0,
    architecture: str = "qwen2",
    num_experts: int = 4,
    num_experts_per_tok: int = 2,
) -> Path:
    """Save a random-init causal LM plus the tiny tokenizer to ``path``; return ``path``.

    ``architecture``: a key of :data:`ARCHITECTURES` (``qwen2`` by default). The mixture-of-experts ones
    (``qwen3_moe``, ``mixtral``) give each of ``num_experts`` experts ``intermediate_size`` and route
    each token to ``num_experts_per_tok`` of them.
    Idempotent: an existing complete folder (same settings) is reused, which keeps test suites fast.
    """
    import torch

    if architecture not in ARCHITECTURES:
        raise ValueError(
            f"unknown tiny architecture {architecture!r}; choose from {', '.join(ARCHITECTURES)}"
        )
    path = Path(path)
    settings = dict(
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        seed=seed,
    )
    if architecture != "qwen2":  # Qwen2 folders built before other architectures keep their marker.
        settings.update(architecture=architecture)
    if architecture in MOE_ARCHITECTURES:
        settings.update(num_experts=num_experts, num_experts_per_tok=num_experts_per_tok)
    marker = path / "rlcore_tiny.json"
    if marker.exists() and json.loads(marker.read_text()) == settings:
        return path
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(path)
    config = tiny_config(
        tokenizer,
        architecture=architecture,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        num_experts=num_experts,
        num_experts_per_tok=num_experts_per_tok,
    )
    torch.manual_seed(seed)
    model = causal_lm_class(architecture)(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    _save_quietly(model, path)
    # Written last: its presence means the folder is complete.
    marker.write_text(json.dumps(settings))
    return path


#: Tiny architectures: HF ``model_type`` -> the causal LM class's name in transformers.
ARCHITECTURES = {
    "qwen2": "Qwen2ForCausalLM",
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
}
MOE_ARCHITECTURES = ("qwen3_moe", "mixtral")


def causal_lm_class(architecture: str) -> Any:
    import transformers

    return getattr(transformers, ARCHITECTURES[architecture])


def tiny_config(
    tokenizer: Any,
    *,
    architecture: str = "qwen2",
    hidden_size: int,
    intermediate_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    max_position_embeddings: int,
    tie_word_embeddings: bool,
    num_experts: int = 4,
    num_experts_per_tok: int = 2,
    **extra: Any,
) -> Any:
    """The HF config of a tiny ``architecture`` model (fp32, the tokenizer's vocabulary and special
    tokens). Every architecture uses SwiGLU, RMSNorm and rope; Qwen3 adds per-head q/k RMSNorm; the
    MoE ones route each token to ``num_experts_per_tok`` of ``num_experts`` experts of width
    ``intermediate_size`` (Qwen3-MoE renormalises the chosen experts' weights, as Qwen3-30B-A3B does)."""
    if architecture == "qwen2":
        return tiny_qwen2_config(
            tokenizer,
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            max_position_embeddings=max_position_embeddings,
            tie_word_embeddings=tie_word_embeddings,
            **extra,
        )
    import transformers

    common = _shared_fields(
        tokenizer,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
    )
    common["rms_norm_eps"] = 1e-6
    if architecture in ("llama", "qwen3"):
        cls = transformers.LlamaConfig if architecture == "llama" else transformers.Qwen3Config
        return cls(intermediate_size=intermediate_size, **common, **extra)
    if architecture == "qwen3_moe":
        routing = dict(norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
        return transformers.Qwen3MoeConfig(
            intermediate_size=intermediate_size,
            moe_intermediate_size=intermediate_size,
            num_experts=num_experts,
            num_experts_per_tok=num_experts_per_tok,
            **common,
            **{**routing, **extra},
        )
    if architecture == "mixtral":
        return transformers.MixtralConfig(
            intermediate_size=intermediate_size,
            num_local_experts=num_experts,
            num_experts_per_tok=num_experts_per_tok,
            **common,
            **extra,
        )
    raise ValueError(f"unknown tiny architecture {architecture!r}; choose from {', '.join(ARCHITECTURES)}")


def tiny_qwen2_config(
    tokenizer: Any,
    *,
    hidden_size: int,
    intermediate_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    max_position_embeddings: int,
    tie_word_embeddings: bool,
    **extra: Any,
) -> Any:
    """The ``Qwen2Config`` of the tiny models (fp32, the tokenizer's vocabulary and special tokens);
    ``extra``: more config fields (``num_labels`` for a classifier)."""
    from transformers import Qwen2Config

    shared = _shared_fields(
        tokenizer,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
    )
    return Qwen2Config(intermediate_size=intermediate_size, **shared, **extra)


def _shared_fields(
    tokenizer: Any,
    *,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    max_position_embeddings: int,
    tie_word_embeddings: bool,
) -> dict[str, Any]:
    """The config fields every tiny architecture sets alike: sizes, the tokenizer's vocabulary and special
    tokens, fp32."""
    return dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )


def _save_quietly(model: Any, path: Path) -> None:
    """``save_pretrained`` without its "Writing model shards" bar: the built-in model is built before a
    run's output is routed to its log files, on the terminal a user watches."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(str(path))
    finally:
        if shown:
            hf_logging.enable_progress_bar()

"""A tiny reward model built locally (no hub), for tests and demos of the ``reward_model:`` role.

A random-init ``Qwen2ForSequenceClassification`` with ``num_labels = 1`` saved with a tokenizer: the
policy's tiny tokenizer (:func:`rlcore.testing.tiny.build_tiny_tokenizer`, so the reward model scores
the policy's token ids as they are) or a tokenizer of its own with a smaller vocabulary and another chat
template (so the provider must decode and re-tokenize, as with a real reward model of another family).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from rlcore.testing.tiny import _save_quietly, build_tiny_tokenizer, tiny_qwen2_config

#: The chat template of the reward model's own tokenizer: unlike the policy's (Qwen style), so that
#: reusing the policy's token ids would be wrong. It ends on EOS, not on the pad token, so the last real
#: token (what engines read) is also the last non-pad token (what HF's classifier reads).
RM_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + ': ' + message['content'] + '\n' }}"
    "{% endfor %}"
    "{{ '<|im_end|>' }}"
)
TOKENIZERS = ("policy", "own")


def build_tiny_reward_model(
    path: str | os.PathLike,
    *,
    tokenizer: str = "policy",
    num_labels: int = 1,
    num_layers: int = 2,
    hidden_size: int = 128,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    seed: int = 1,
) -> Path:
    """Save a random-init ``Qwen2ForSequenceClassification`` and its tokenizer to ``path``; return it.

    ``tokenizer``: ``"policy"`` (the tiny policy tokenizer, vocab 1024, Qwen chat template) or ``"own"``
    (vocab 512, :data:`RM_CHAT_TEMPLATE`). The score head is drawn with std ``1/sqrt(hidden_size)`` so
    that scores spread over about [-3, 3] rather than HF's near-zero init. ``num_labels != 1`` builds
    the kind of classifier the reward-model checks refuse. Idempotent like ``build_tiny_model``.
    """
    import torch
    from transformers import Qwen2ForSequenceClassification

    if tokenizer not in TOKENIZERS:
        raise ValueError(f"tokenizer must be one of {TOKENIZERS}, got {tokenizer!r}")
    path = Path(path)
    settings = dict(
        tokenizer=tokenizer,
        num_labels=num_labels,
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        seed=seed,
    )
    marker = path / "rlcore_tiny_reward.json"
    if marker.exists() and json.loads(marker.read_text()) == settings:
        return path
    path.mkdir(parents=True, exist_ok=True)
    tok = build_tiny_tokenizer(None, vocab_size=1024 if tokenizer == "policy" else 512)
    if tokenizer == "own":
        tok.chat_template = RM_CHAT_TEMPLATE
    tok.save_pretrained(str(path))
    config = tiny_qwen2_config(
        tok,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        num_labels=num_labels,
    )
    torch.manual_seed(seed)
    model = Qwen2ForSequenceClassification(config)
    with torch.no_grad():
        model.score.weight.normal_(0.0, 1.0 / math.sqrt(hidden_size))
    _save_quietly(model, path)
    marker.write_text(json.dumps(settings))
    return path

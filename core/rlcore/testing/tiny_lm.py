"""The tiny language model inside the fake engines, and the log-prob maths both fakes share.

``TinyLM`` sees the current token and (optionally) the previous one::

    e_t    = E[x_t]                                  E: model.embed_tokens.weight  [V, D]
    h_t    = e_t + P e_{t-1}                         P: model.prev_proj.weight     [D, D]
                                                     (e_{t-1} = 0 at the first real token)
    h_t   += W_down gelu(W_up h_t)                   model.mlp.up_proj.weight      [2D, D]
                                                     model.mlp.down_proj.weight    [D, 2D]
    out_t  = W_head h_t                              lm_head.weight [V, D]  or  score.weight [1, D]

Parameter names follow Hugging Face, so the weight stream of a fake looks like a real model's. Left
padding does not change any output: the previous-token term is masked by ``attention_mask``. Weights are
drawn from a private ``torch.Generator`` seeded with ``seed``, so two TinyLMs with the same shape and seed
are identical whatever else the process did with the global RNG.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

HEADS = ("lm", "value", "score")
DEFAULT_VOCAB_SIZE = 256


def dtype_from_name(name: str) -> torch.dtype:
    """``"float32"`` -> ``torch.float32``; a clear error for anything that is not a floating dtype."""
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(
            f"dtype {name!r} is not a torch floating-point dtype; use float32, bfloat16 or float64"
        )
    return dtype


def model_path_config(model_path: str | None) -> dict:
    """``<model_path>/config.json`` as a dict, or ``{}`` when there is no such file."""
    if not model_path:
        return {}
    file = Path(model_path) / "config.json"
    if not file.is_file():
        return {}
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{file} is not valid JSON: {exc}") from exc


def resolve_vocab_size(vocab_size: int | None, model_path: str | None) -> int:
    """The configured vocabulary, else the model folder's ``vocab_size``, else :data:`DEFAULT_VOCAB_SIZE`."""
    if vocab_size is not None:
        return int(vocab_size)
    return int(model_path_config(model_path).get("vocab_size", DEFAULT_VOCAB_SIZE))


class TinyLM(nn.Module):
    """Embedding, previous-token mixing, one residual MLP, and a head. See the module docstring."""

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        *,
        head: str = "lm",
        prev_token: bool = True,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        if head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {head!r}")
        self.vocab_size, self.hidden_size, self.head, self.prev_token = (
            vocab_size,
            hidden_size,
            head,
            prev_token,
        )
        d = hidden_size
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(vocab_size, d)
        if prev_token:
            self.model.prev_proj = nn.Linear(d, d, bias=False)
        self.model.mlp = nn.Module()
        self.model.mlp.up_proj = nn.Linear(d, 2 * d, bias=False)
        self.model.mlp.down_proj = nn.Linear(2 * d, d, bias=False)
        if head == "lm":
            self.lm_head = nn.Linear(d, vocab_size, bias=False)
        else:
            self.score = nn.Linear(d, 1, bias=False)
        self._init_weights(seed)
        self.to(dtype)

    @torch.no_grad()
    def _init_weights(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        d = self.hidden_size
        # Trunk first, head last: the trunk of a value model equals the policy's for the same seed.
        self.model.embed_tokens.weight.copy_(torch.randn(self.vocab_size, d, generator=g))
        if self.prev_token:
            self.model.prev_proj.weight.copy_(torch.randn(d, d, generator=g) * (0.5 / math.sqrt(d)))
        self.model.mlp.up_proj.weight.copy_(torch.randn(2 * d, d, generator=g) / math.sqrt(d))
        self.model.mlp.down_proj.weight.copy_(torch.randn(d, 2 * d, generator=g) * (0.5 / math.sqrt(2 * d)))
        head = self.lm_head if self.head == "lm" else self.score
        head.weight.copy_(torch.randn(*head.weight.shape, generator=g) / math.sqrt(d))

    def hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``input_ids [b, T]`` (``attention_mask [b, T]``, 1 on real tokens) -> hidden states ``[b, T, D]``."""
        if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= self.vocab_size):
            raise ValueError(
                f"token ids must lie in [0, {self.vocab_size}), got range [{int(input_ids.min())}, "
                f"{int(input_ids.max())}]; set fake.vocab_size to the tokenizer's vocabulary size"
            )
        e = self.model.embed_tokens(input_ids)
        h = e
        if self.prev_token:
            prev = torch.zeros_like(e)
            prev[:, 1:] = e[:, :-1]
            if attention_mask is not None:
                # The first real token of a left-padded row must not see the pad before it.
                prev[:, 1:] = prev[:, 1:] * attention_mask[:, :-1, None].to(e.dtype)
            h = h + self.model.prev_proj(prev)
        return h + self.model.mlp.down_proj(F.gelu(self.model.mlp.up_proj(h)))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[b, T, V]`` (``lm`` head) or one scalar per position ``[b, T]`` (``value``/``score``)."""
        h = self.hidden(input_ids, attention_mask)
        if self.head == "lm":
            return self.lm_head(h)
        return self.score(h).squeeze(-1)


def token_log_probs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits [..., V]`` and ``tokens [...]`` -> (log-prob of each token, entropy), each ``[...]``.

    Both are of ``softmax(logits / temperature)`` in float32 or wider, as the sampler draws from it.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for log-probs, got {temperature}")
    work = logits.float() if logits.dtype not in (torch.float32, torch.float64) else logits
    logp = torch.log_softmax(work / temperature, dim=-1)
    picked = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return picked, entropy

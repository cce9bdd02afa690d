"""The Hugging Face model behind an engine, and what each head reads from its hidden states.

:class:`HeadedModel` is the root module FSDP shards. Its forward runs the HF backbone on one
micro-batch (padded ``[b, T]`` or packed ``[1, N]``), picks the ``M`` hidden states the caller asks for
(flat indices into the ``b*T`` or ``N`` token positions) and applies the role's head to those only:

- ``"lm"``: log-probs of ``targets`` under ``softmax(logits / temperature)`` and the entropy of that
  distribution, computed in chunks of tokens so full-vocabulary fp32 logits never exist for the batch
  (:mod:`rlcore.kernels.logits`);
- ``"value"`` / ``"score"``: the scalar of a one-output linear head (``values``).

With sequence parallelism the inputs are this rank's slice of a packed row, and the model hands the
group down to the attention layers (:mod:`rlcore_fsdp.sequence_parallel`); the head reads the slice's
own positions, as it would any row's.

Running the head inside the root's forward matters: FSDP gathers the root's parameters (embeddings,
final norm, output layer) around the root's forward and backward, not around a direct call to a
submodule.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
from rlcore.kernels.logits import linear_log_probs
from rlcore.vision import is_vision_model
from rlcore.vision.inputs import BANNED_LOGIT

from rlcore_fsdp.attention import SP_KWARG
from rlcore_fsdp.sequence_parallel import SequenceParallel

#: Hugging Face auto class per head. Value models load as token classifiers and reward models as
#: sequence classifiers with one label, so ``export_hf`` writes folders those classes load again.
HEAD_CLASSES = {
    "lm": "AutoModelForCausalLM",
    "value": "AutoModelForTokenClassification",
    "score": "AutoModelForSequenceClassification",
}

# RL needs the training forward to compute the same function as the log-prob forward (ratios of the
# two are the importance weights), so every dropout the config knows is switched off.
_DROPOUT_KEYS = (
    "attention_dropout",
    "hidden_dropout",
    "classifier_dropout",
    "dropout",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
)

# Config fields by which some architectures change the logits after the output layer; the chunked
# head applies the output layer alone, so such models would get wrong log-probs.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale", "logits_scaling")


def torch_dtype(name: str, key: str = "dtype") -> torch.dtype:
    """``"float32"`` -> ``torch.float32``; a clear error naming ``key`` otherwise."""
    allowed = ("float32", "bfloat16", "float16", "float64")
    if name not in allowed:
        raise ValueError(f"{key} must be one of {allowed}, got {name!r}")
    return getattr(torch, name)


def load_hf_model(model_path: str, head: str, dtype: torch.dtype, attn_implementation: str, seed: int):
    """Load the HF model for ``head`` from a local folder (on the CPU, dropout off).

    A value or score head missing from the checkpoint (a causal LM folder) is initialised from ``seed``,
    so every rank starts from the same head.
    """
    import transformers

    if head not in HEAD_CLASSES:
        raise ValueError(f"EngineSpec.head must be one of {sorted(HEAD_CLASSES)}, got {head!r}")
    path = Path(model_path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"EngineSpec.model_path {str(path)!r} has no config.json; point it to a local Hugging Face "
            "model folder (the engine does not download)"
        )
    config = transformers.AutoConfig.from_pretrained(path)
    for key in _DROPOUT_KEYS:
        if isinstance(getattr(config, key, None), float):
            setattr(config, key, 0.0)
    if head == "lm":
        for key in _LOGIT_TRANSFORMS:
            value = getattr(config, key, None)
            if value not in (None, 1, 1.0):
                raise ValueError(
                    f"model {str(path)!r} transforms its logits ({key}={value}); the FSDP engine's chunked "
                    "log-prob head applies only the output layer, so it does not support this architecture"
                )
    else:
        config.num_labels = 1
        config.classifier_dropout = 0.0
    torch.manual_seed(seed)
    cls = getattr(transformers, HEAD_CLASSES[head])
    if head == "lm" and is_vision_model(path):
        cls = transformers.AutoModelForImageTextToText  # Qwen2.5-VL ...: the vision tower and the LM
    model = cls.from_pretrained(path, config=config, dtype=dtype, attn_implementation=attn_implementation)
    model.config.use_cache = False
    if head != "lm" and not isinstance(getattr(model, "score", None), nn.Linear):
        raise ValueError(
            f"{type(model).__name__} (from {str(path)!r}) has no `score` linear layer; the value and score "
            "heads need an architecture whose HF token/sequence classifier uses one (Llama, Qwen2, Mistral...)"
        )
    return model


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's transformer blocks (the classes HF lists in ``_no_split_modules``), in order."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"cannot find the decoder layers of {type(model).__name__}: its `_no_split_modules` "
            f"({sorted(names)}) names no submodule class; FSDP needs them to shard layer by layer"
        )
    return layers


class HeadedModel(nn.Module):
    """An HF model plus the reading of its head at chosen token positions (the FSDP root module)."""

    def __init__(
        self,
        hf_model: nn.Module,
        head: str,
        compiled: bool = False,
        keep_logits: bool = False,
        sequence_parallel: SequenceParallel | None = None,
        banned_token_ids: tuple[int, ...] = (),
    ):
        super().__init__()
        self.hf = hf_model
        #: Tokens whose logits get ``BANNED_LOGIT`` (a vision model's image tokens, as in its rollouts).
        self.banned_token_ids = tuple(banned_token_ids)
        self.head = head
        self.compiled = compiled  # fuse the log-prob head's elementwise work (torch.compile)
        self.keep_logits = keep_logits  # keep the head's logits for the backward (rlcore.kernels.logits)
        self.sequence_parallel = sequence_parallel  # inputs are this rank's slice (varlen attention only)

    def backbone(self) -> nn.Module:
        return getattr(self.hf, self.hf.base_model_prefix)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        index: torch.Tensor,
        targets: torch.Tensor | None = None,
        temperature: float = 1.0,
        chunk_size: int = 1024,
        cu_seq_lens: torch.Tensor | None = None,
        max_length: int | None = None,
        **images: torch.Tensor,
    ) -> dict[str, torch.Tensor]:
        """``input_ids``/``position_ids [b, T]`` (``attention_mask [b, T]`` or None when packed into
        ``b = 1``), ``index [M]`` flat positions into ``b*T``, ``targets [M]`` (lm head). Packed inputs
        also bring ``cu_seq_lens [n+1]`` (int32, sequence starts) and ``max_length`` (the longest
        sequence), which the ``varlen`` attention backend reads (:mod:`rlcore_fsdp.attention`).
        ``images``: a vision-language model's ``pixel_values``, ``image_grid_thw`` and
        ``mm_token_type_ids``, with ``position_ids`` its M-RoPE positions (:mod:`rlcore_fsdp.vision`).

        Returns ``{"log_probs": [M], "entropy": [M]}`` (lm) or ``{"values": [M]}`` (value, score) in
        fp32, or fp64 for a float64 model.
        """
        packing = {}
        if cu_seq_lens is not None:
            packing = dict(
                cu_seq_lens_q=cu_seq_lens,
                cu_seq_lens_k=cu_seq_lens,
                max_length_q=max_length,
                max_length_k=max_length,
            )
            if self.sequence_parallel is not None:
                packing[SP_KWARG] = self.sequence_parallel
        out = self.backbone()(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            **packing,
            **images,
        )
        hidden = out.last_hidden_state
        hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, index)  # [M, H]
        if self.head == "lm":
            out_layer = self.hf.get_output_embeddings()
            bias = out_layer.bias
            if self.banned_token_ids:
                banned = torch.zeros(out_layer.weight.shape[0], dtype=hidden.dtype, device=hidden.device)
                banned[list(self.banned_token_ids)] = BANNED_LOGIT
                bias = banned if bias is None else bias + banned
            log_probs, entropy = linear_log_probs(
                hidden,
                out_layer.weight,
                bias,
                targets,
                temperature,
                chunk_size,
                self.compiled,
                self.keep_logits,
            )
            return {"log_probs": log_probs, "entropy": entropy}
        values = self.hf.score(hidden).squeeze(-1)
        # A copy, not a view: FSDP's pre-backward hook on a view output is lost on in-place use.
        return {"values": values.to(torch.promote_types(values.dtype, torch.float32), copy=True)}

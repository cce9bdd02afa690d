"""``builtin:smollm2-135m-instruct`` is built from what transformers' GGUF loader returns, and loaders of
different versions return different things: 5.17 and 5.19 record ``quantization_config`` on the config,
5.12.1 (the version SGLang pins) records none and names the wrong end-of-sequence token. Here
:func:`rlcore.models.smollm2.build` runs whole on a tiny Llama standing in for each loader's output
(the real GGUF read takes 15 s and is covered by ``tests/test_smollm2.py``), and the folder it writes
must be the same ordinary checkpoint either way."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from rlcore.models import smollm2
from rlcore.testing.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return build_tiny_model(
        tmp_path_factory.mktemp("llama"), architecture="llama", num_layers=1, hidden_size=64, num_heads=2,
        num_kv_heads=1, intermediate_size=128,
    )  # fmt: skip


def _as_the_loader_returns(tiny_llama, version):
    """The tokenizer and model that ``version``'s GGUF loader gives for SmolLM2: the file's metadata ids
    (bos 1, eos 2, pad 2, unk 0: the tiny tokenizer's specials sit at the same ids) on the config."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_llama)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    model.config.update(dict(bos_token_id=1, eos_token_id=2, pad_token_id=2, unk_token_id=0))
    if version == "5.19":
        GgufConfig = getattr(transformers.utils.quantization_config, "GgufConfig", None)
        if GgufConfig is None:
            pytest.skip(f"transformers {transformers.__version__} has no GgufConfig to record")
        model.config.quantization_config = GgufConfig(gguf_file=smollm2.GGUF_FILE, dequantize=True)
    else:  # 5.12.1: no quantization record, <|im_start|> as end of sequence, no padding token
        assert not hasattr(model.config, "quantization_config")
        tokenizer.eos_token, tokenizer.pad_token = "<|im_start|>", None
        tokenizer.clean_up_tokenization_spaces = True
    return tokenizer, model


@pytest.mark.parametrize("version", ["5.12.1", "5.19"])
def test_the_folder_is_an_ordinary_checkpoint_whatever_the_loader_recorded(
    tiny_llama, version, tmp_path, monkeypatch
):
    tokenizer, loaded = _as_the_loader_returns(tiny_llama, version)
    source = tmp_path / "site-packages" / smollm2.PACKAGE / smollm2.GGUF_FILE
    monkeypatch.setattr(smollm2, "missing_requirement", lambda: None)
    monkeypatch.setattr(smollm2, "gguf_path", lambda: source)

    def from_gguf(result):
        def load(folder, *, gguf_file, **kwargs):
            assert (folder, gguf_file) == (source.parent, source.name)
            return result

        return load

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_gguf(tokenizer))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_gguf(loaded))
    target = smollm2.build(tmp_path / "models" / smollm2.NAME)
    monkeypatch.undo()  # read the folder back with the real readers

    config = json.loads((target / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    assert "quantization_config" in vars(loaded.config) or version == "5.12.1"  # the input is untouched
    model = transformers.AutoModelForCausalLM.from_pretrained(target)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.name_or_path == str(target)
    mine, want = model.state_dict(), loaded.state_dict()
    assert sorted(mine) == sorted(want)
    assert all(torch.equal(mine[name], want[name]) for name in want)

    tok = transformers.AutoTokenizer.from_pretrained(target)
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token) == (
        "<|im_start|>", "<|im_end|>", "<|im_end|>", "<|endoftext|>",
    )  # fmt: skip
    assert (tok.eos_token_id, tok.pad_token_id) == (2, 2)
    assert not json.loads((target / "tokenizer_config.json").read_text()).get("clean_up_tokenization_spaces")
    assert (target / smollm2.DONE).is_file()

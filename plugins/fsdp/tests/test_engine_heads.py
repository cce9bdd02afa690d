"""Value and score heads, the HF export, the weight stream, release/resume and the engine's refusals."""

import json

import pytest
import torch
from fsdp_support import batch, hf_reference, nll_entropy_loss, score_loss, spec
from rlcore.api import DistInfo
from rlcore.devices import get_platform
from rlcore.testing.contract import value_mse_loss
from rlcore.weights import assemble, tensor_bytes
from rlcore_fsdp.config import FSDPConfig
from rlcore_fsdp.engine import FSDPEngine
from safetensors.torch import load_file


def make(model_path, config=None, **overrides) -> FSDPEngine:
    return FSDPEngine(
        spec(str(model_path), **overrides), config or FSDPConfig(), get_platform("cpu"), DistInfo()
    )


def unpadded_rows(data):
    """Each row's real token ids and its number of real prompt tokens."""
    mask = data["attention_mask"].bool()
    p = mask.shape[1] - data["responses"].shape[1]
    return [(data["input_ids"][i][mask[i]], int(mask[i, :p].sum())) for i in range(len(data))]


def test_value_head_matches_exported_token_classifier_and_trains(tiny_model_path, tmp_path):
    from transformers import AutoModelForTokenClassification

    data = batch()
    engine = make(tiny_model_path, head="value", lr=1e-3, micro_batch_size=3)
    values = engine.infer(data, ["values"])["values"]
    assert values.shape == data["responses"].shape
    real = data["attention_mask"][:, -values.shape[1] :].bool()
    assert torch.isfinite(values).all() and (values[~real] == 0).all()
    engine.export_hf(str(tmp_path / "critic"))
    hf = AutoModelForTokenClassification.from_pretrained(tmp_path / "critic", dtype=torch.float64).eval()
    for i, (ids, n_prompt) in enumerate(unpadded_rows(data)):
        with torch.no_grad():
            want = hf(ids[None]).logits[0, n_prompt - 1 : ids.shape[0] - 1, 0]
        torch.testing.assert_close(values[i, : want.shape[0]].double(), want, rtol=0, atol=1e-5)
    losses = [engine.train_step(data, value_mse_loss)["loss"] for _ in range(4)]
    assert losses[-1] < losses[0], losses


def test_score_head_reads_last_token_like_sequence_classifier_and_trains(tiny_model_path, tmp_path):
    from transformers import AutoModelForSequenceClassification

    data = batch()
    data.tensors["score_targets"] = torch.linspace(-1, 1, len(data))
    engine = make(tiny_model_path, head="score", lr=1e-4, micro_batch_size=4)
    scores = engine.infer(data, ["scores"])["scores"]
    assert scores.shape == (len(data),) and torch.isfinite(scores).all()
    engine.export_hf(str(tmp_path / "rm"))
    assert json.loads((tmp_path / "rm" / "config.json").read_text())["architectures"] == [
        "Qwen2ForSequenceClassification"
    ]
    hf = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm", dtype=torch.float64).eval()
    with torch.no_grad():
        want = torch.stack([hf(ids[None]).logits[0, 0] for ids, _ in unpadded_rows(data)])
    torch.testing.assert_close(scores.double(), want, rtol=0, atol=1e-5)
    losses = [engine.train_step(data, score_loss)["loss"] for _ in range(4)]
    assert losses[-1] < losses[0], losses


def test_export_hf_folder_loads_in_transformers_with_the_engines_log_probs(tiny_model_path, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data = batch()
    engine = make(tiny_model_path, lr=1e-2, temperature=0.9)
    engine.train_step(data, nll_entropy_loss)
    out = tmp_path / "actor"
    engine.export_hf(str(out))
    engine.export_hf(str(out))  # replacing an earlier export works
    assert not (out.parent / "actor.tmp").exists() and not (out.parent / "actor.old").exists()
    saved = load_file(str(out / "model.safetensors"))
    assert "lm_head.weight" not in saved, "tied embeddings are written once, as Hugging Face does"
    assert all(t.dtype == torch.float32 for t in saved.values())
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["tie_word_embeddings"] is True
    assert AutoTokenizer.from_pretrained(out).eos_token == "<|im_end|>"
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64)
    want, _ = hf_reference(hf, data, temperature=0.9)
    got = engine.infer(data, ["log_probs"])["log_probs"]
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-5)


def test_weight_stream_has_hf_names_explicit_lm_head_and_bounded_buckets(tiny_model_path):
    from transformers import AutoModelForCausalLM

    engine = make(tiny_model_path)
    names = set(AutoModelForCausalLM.from_pretrained(tiny_model_path).state_dict())
    bound = 100_000
    buckets = list(engine.export_weights(torch.bfloat16, bound))
    assert all(sum(tensor_bytes(t) for _, t in b) <= bound for b in buckets)
    stream = dict(assemble(buckets))
    assert set(stream) == names and "lm_head.weight" in stream
    assert all(t.dtype == torch.bfloat16 for t in stream.values())
    assert torch.equal(stream["lm_head.weight"], stream["model.embed_tokens.weight"])
    original = load_file(str(tiny_model_path / "model.safetensors"))
    for name, tensor in original.items():
        assert torch.equal(stream[name], tensor.to(torch.bfloat16)), name


def test_release_resume_and_frozen_engines(tiny_model_path):
    data = batch()
    engine = make(tiny_model_path)
    before = engine.infer(data, ["log_probs"])["log_probs"]
    engine.release(["weights", "optimizer", "grads"])
    with pytest.raises(RuntimeError, match=r"call resume\(\['weights'\]\) first"):
        engine.infer(data, ["log_probs"])
    engine.resume(["weights", "optimizer"])
    assert torch.equal(engine.infer(data, ["log_probs"])["log_probs"], before)
    with pytest.raises(ValueError, match="unknown release/resume tag.*kv_cache"):
        engine.release(["kv_cache"])

    frozen = make(tiny_model_path, trainable=False)
    assert not any(p.requires_grad for p in frozen.module.parameters())
    assert torch.equal(frozen.infer(data, ["log_probs"])["log_probs"], before)
    with pytest.raises(RuntimeError, match="trainable=False"):
        frozen.train_step(data, nll_entropy_loss)


def test_refusals_name_the_setting(tiny_model_path, tmp_path):
    data = batch()
    engine = make(tiny_model_path, max_tokens_per_micro_batch=4)
    with pytest.raises(
        ValueError, match="not available with head 'lm'; allowed: \\['log_probs', 'entropy'\\]"
    ):
        engine.infer(data, ["values"])
    with pytest.raises(ValueError, match="more than EngineSpec.max_tokens_per_micro_batch=4"):
        engine.infer(data, ["log_probs"])
    with pytest.raises(ValueError, match="EngineSpec.head must be one of"):
        make(tiny_model_path, head="policy")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        make(tmp_path)
    with pytest.raises(ValueError, match="attn_implementation is 'flex_attention'"):
        make(tiny_model_path, FSDPConfig(use_remove_padding=True, attn_implementation="flex_attention"))
    with pytest.raises(ValueError, match="fsdp.mixed_precision must be 'bfloat16', null or 'auto'"):
        FSDPConfig(mixed_precision="float16")


def test_packing_probe_refuses_a_model_that_attends_across_sequences(tiny_model_path, monkeypatch):
    import transformers.masking_utils as masking_utils

    # Without packed-sequence detection the causal mask spans the whole packed row, as in transformers
    # versions (or model code) that ignore position_ids resets.
    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", lambda position_ids: None)
    with pytest.raises(RuntimeError, match="lets packed sequences attend to each other"):
        make(tiny_model_path, FSDPConfig(use_remove_padding=True))
    make(tiny_model_path, FSDPConfig(use_remove_padding=False))  # the padded path does not depend on it


def test_checkpoint_before_the_first_step_leaves_training_unchanged(tiny_model_path, tmp_path):
    data = batch()
    saved = make(tiny_model_path)
    saved.save_checkpoint(str(tmp_path / "step0"))
    loaded = make(tiny_model_path)
    loaded.load_checkpoint(str(tmp_path / "step0"))
    untouched = make(tiny_model_path)
    metrics = [e.train_step(data, nll_entropy_loss) for e in (saved, loaded, untouched)]
    assert metrics[0] == metrics[1] == metrics[2]
    outs = [e.infer(data, ["log_probs"])["log_probs"] for e in (saved, loaded, untouched)]
    assert torch.equal(outs[0], outs[2]) and torch.equal(outs[1], outs[2])
    # A frozen engine (reference policy) loads a trainer's checkpoint: weights only.
    saved.save_checkpoint(str(tmp_path / "step1"))
    frozen = make(tiny_model_path, trainable=False)
    frozen.load_checkpoint(str(tmp_path / "step1"))
    assert torch.equal(frozen.infer(data, ["log_probs"])["log_probs"], outs[0])
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        frozen.load_checkpoint(str(tmp_path / "nothing"))

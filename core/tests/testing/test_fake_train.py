"""FakeTrainEngine against independent references: a hand-written AdamW step on a float64 per-row
loss, the float64 loop model, hand-computed LR schedules, and a real 2-process gloo run."""

import json
import math
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from rlcore.api import Batch, EngineSpec
from rlcore.testing.contract import contract_batch, token_nll_loss
from rlcore.testing.fakes import FakeTrainConfig, FakeTrainEngine
from rlcore.testing.tiny_lm import TinyLM
from safetensors.torch import load_file

WORKER = Path(__file__).with_name("dp_worker.py")
SPEC = dict(model_path="", dtype="float64", lr=0.05, weight_decay=0.1, grad_clip=0.5, micro_batch_size=1)


def make(**overrides):
    spec = {**SPEC, **overrides}
    return FakeTrainEngine(EngineSpec(**spec), FakeTrainConfig(vocab_size=50, hidden_size=8))


def rows(batch):
    """(prompt ids, response ids) of each row, padding removed."""
    out = []
    p = batch["prompts"].shape[1]
    for i in range(len(batch)):
        prompt = batch["prompts"][i][batch["attention_mask"][i, :p].bool()].tolist()
        response = batch["responses"][i][batch["response_mask"][i].bool()].tolist()
        out.append((prompt, response))
    return out


def reference_adamw_steps(batch, steps, *, lr, wd, clip, betas=(0.9, 0.999), eps=1e-8):
    """Full-batch NLL (one row at a time) and AdamW written out by hand, in float64."""
    model = TinyLM(50, 8, seed=0, dtype=torch.float64)
    params = list(model.parameters())
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    losses, norms = [], []
    for t in range(1, steps + 1):
        total = 0
        for prompt, response in rows(batch):
            logits = model(torch.tensor([prompt + response]))[0]
            for j, tok in enumerate(response):
                total = total - torch.log_softmax(logits[len(prompt) + j - 1], -1)[tok]
        loss = total / batch.meta["global_tokens"]
        grads = torch.autograd.grad(loss, params)
        norm = math.sqrt(sum(float((g**2).sum()) for g in grads))
        coef = min(1.0, clip / (norm + 1e-6))
        with torch.no_grad():
            for p, g, mi, vi in zip(params, grads, m, v, strict=True):
                g = g * coef
                p.mul_(1 - lr * wd)
                mi.mul_(betas[0]).add_((1 - betas[0]) * g)
                vi.mul_(betas[1]).add_((1 - betas[1]) * g * g)
                m_hat, v_hat = mi / (1 - betas[0] ** t), vi / (1 - betas[1] ** t)
                p.sub_(lr * m_hat / (v_hat.sqrt() + eps))
        losses.append(float(loss.detach()))
        norms.append(norm)
    return model, losses, norms


def test_train_steps_match_hand_written_adamw():
    batch = contract_batch(4, vocab_low=3, vocab_high=50, seed=0)
    engine = make()
    metrics = [engine.train_step(batch, token_nll_loss) for _ in range(2)]
    ref, losses, norms = reference_adamw_steps(batch, 2, lr=0.05, wd=0.1, clip=0.5)
    assert norms[0] > 0.5, "the reference must exercise gradient clipping"
    for got, loss, norm in zip(metrics, losses, norms, strict=True):
        assert got["loss"] == pytest.approx(loss, rel=1e-10)
        assert got["grad_norm"] == pytest.approx(norm, rel=1e-10)
        assert got["lr"] == 0.05
        assert got["nll"] == pytest.approx(loss / 4, rel=1e-10)  # mean over the 4 micro-batches
    for (name, p), (_, q) in zip(engine.model.named_parameters(), ref.named_parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12, msg=name)
    assert engine.global_step == 2


def test_data_parallel_over_two_processes_equals_one(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    outs = [tmp_path / f"rank{r}.pt" for r in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(r), "2", str(port), str(outs[r])], stderr=subprocess.PIPE
        )
        for r in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()[-3000:]
    results = [torch.load(o, weights_only=False) for o in outs]
    assert [r["rows"] for r in results] == [2, 1]  # uneven shards
    batch = contract_batch(3, vocab_low=3, vocab_high=50, seed=2)
    ref, losses, norms = reference_adamw_steps(batch, 2, lr=0.05, wd=0.1, clip=0.5)
    for r in results:
        for got, loss, norm in zip(r["metrics"], losses, norms, strict=True):
            assert got["loss"] == pytest.approx(loss, rel=1e-10)
            assert got["grad_norm"] == pytest.approx(norm, rel=1e-10)
        for name, q in ref.named_parameters():
            torch.testing.assert_close(r["params"][name], q.detach(), rtol=1e-10, atol=1e-12, msg=name)


def test_lr_schedule_warmup_then_cosine():
    engine = make(lr=1.0, warmup_steps=2, total_steps=6, lr_schedule="cosine", min_lr_ratio=0.1)
    batch = contract_batch(2, vocab_low=3, vocab_high=50)
    lrs = [engine.train_step(batch, token_nll_loss)["lr"] for _ in range(8)]
    # warm-up 1/2, 2/2; cosine from 1.0 at step 2 to 0.1 at step 6: 0.1 + 0.45 (1 + cos(pi p))
    want = [
        0.5,
        1.0,
        1.0,
        0.1 + 0.45 * (1 + math.sqrt(0.5)),
        0.55,
        0.1 + 0.45 * (1 - math.sqrt(0.5)),
        0.1,
        0.1,
    ]
    assert lrs == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError, match="lr_schedule"):
        make(lr_schedule="linear")


def test_token_budget_micro_batches():
    batch = contract_batch(4, vocab_low=3, vocab_high=50)  # rows of 3, 8, 3, 8 real tokens
    assert batch["attention_mask"].sum(1).tolist() == [3, 8, 3, 8]
    sizes = []

    def recording_loss(outputs, mb):
        sizes.append(len(mb))
        return token_nll_loss(outputs, mb)

    whole = make(micro_batch_size=4).train_step(batch, token_nll_loss)
    budget = make(max_tokens_per_micro_batch=11).train_step(batch, recording_loss)
    assert sizes == [2, 2]
    assert budget["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-10)
    sizes.clear()
    make(max_tokens_per_micro_batch=5).train_step(batch, recording_loss)
    assert sizes == [1, 1, 1, 1]  # a row longer than the budget still gets its own micro-batch


def test_value_and_score_heads_match_loop_reference(ref_outputs):
    batch = contract_batch(4, vocab_low=3, vocab_high=50, seed=1)
    values = make(head="value").infer(batch, ["values"])["values"]
    scores = make(head="score").infer(batch, ["scores"])["scores"]
    model = TinyLM(50, 8, head="value", seed=0, dtype=torch.float64)
    for i, (prompt, response) in enumerate(rows(batch)):
        out = [o[0] for o in ref_outputs(model, prompt + response)]
        # the value of response token j is read where token j is predicted (position P + j - 1)
        want = [out[len(prompt) + j - 1] for j in range(len(response))]
        torch.testing.assert_close(values[i, : len(response)], torch.tensor(want, dtype=torch.float64))
        assert (values[i, len(response) :] == 0).all()
        assert scores[i].item() == pytest.approx(out[-1], rel=1e-10)


def test_infer_log_probs_match_loop_reference(ref_outputs, ref_log_softmax):
    batch = contract_batch(4, vocab_low=3, vocab_high=50, seed=4)
    engine = make(temperature=0.7)
    out = engine.infer(batch, ["log_probs", "entropy"])
    model = TinyLM(50, 8, seed=0, dtype=torch.float64)
    for i, (prompt, response) in enumerate(rows(batch)):
        logits = ref_outputs(model, prompt + response)
        for j, tok in enumerate(response):
            logp = ref_log_softmax(logits[len(prompt) + j - 1], 0.7)
            assert out["log_probs"][i, j].item() == pytest.approx(logp[tok], rel=1e-10)
            assert out["entropy"][i, j].item() == pytest.approx(
                -sum(math.exp(x) * x for x in logp), rel=1e-10
            )
        assert (out["log_probs"][i, len(response) :] == 0).all()


def test_infer_rejects_outputs_of_another_head():
    with pytest.raises(ValueError, match=r"head 'lm' computes \['log_probs', 'entropy'\], not \['values'\]"):
        make().infer(contract_batch(2, vocab_low=3, vocab_high=50), ["values"])
    with pytest.raises(ValueError, match="head must be one of"):
        make(head="policy")


def test_release_and_resume_bookkeeping():
    engine = make()
    batch = contract_batch(2, vocab_low=3, vocab_high=50)
    engine.train_step(batch, token_nll_loss)
    engine.release(["weights", "optimizer", "grads"])
    assert engine.released == {"weights", "optimizer", "grads"}
    assert all(p.numel() == 0 for p in engine.model.parameters()), "released weights still hold memory"
    assert not engine.optimizer.state, "released optimizer state still held"
    with pytest.raises(RuntimeError, match=r"infer: \['weights'\] released; call resume"):
        engine.infer(batch)
    with pytest.raises(RuntimeError, match=r"train_step: \['optimizer', 'weights'\] released"):
        engine.train_step(batch, token_nll_loss)
    with pytest.raises(ValueError, match="unknown release tag"):
        engine.release(["kv_cache"])
    engine.resume(["optimizer"])  # before the weights: state is still placed correctly
    engine.resume(["weights", "grads"])
    assert engine.released == set()
    assert all(s["exp_avg"].shape == p.shape for p, s in engine.optimizer.state.items())
    engine.train_step(batch, token_nll_loss)


def test_untrainable_engine_and_bad_loss(tmp_path):
    batch = contract_batch(2, vocab_low=3, vocab_high=50)
    frozen = make(trainable=False)
    assert frozen.optimizer is None  # a reference model keeps no optimizer state
    with pytest.raises(RuntimeError, match="trainable=False"):
        frozen.train_step(batch, token_nll_loss)
    frozen.release(["weights", "optimizer", "grads"])
    frozen.resume(["weights", "optimizer", "grads"])
    frozen.save_checkpoint(str(tmp_path / "frozen"))
    other = make(trainable=False, seed=1)
    other.load_checkpoint(str(tmp_path / "frozen"))
    assert torch.equal(other.infer(batch)["log_probs"], frozen.infer(batch)["log_probs"])
    with pytest.raises(TypeError, match="scalar tensor"):
        make().train_step(batch, lambda out, mb: (out["log_probs"], {}))


def test_checkpoint_files_replace_atomically(tmp_path):
    batch = contract_batch(2, vocab_low=3, vocab_high=50)
    engine = make()
    engine.train_step(batch, token_nll_loss)
    engine.save_checkpoint(str(tmp_path / "ckpt"))
    engine.train_step(batch, token_nll_loss)
    engine.save_checkpoint(str(tmp_path / "ckpt"))  # replaces the first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temp or old folders left
    fresh = make()
    fresh.load_checkpoint(str(tmp_path / "ckpt"))
    assert fresh.global_step == 2
    for p, q in zip(fresh.model.parameters(), engine.model.parameters(), strict=True):
        assert torch.equal(p, q)
    with pytest.raises(FileNotFoundError, match="no FakeTrainEngine checkpoint"):
        fresh.load_checkpoint(str(tmp_path / "missing"))
    wide = FakeTrainEngine(EngineSpec(**SPEC), FakeTrainConfig(vocab_size=50, hidden_size=16))
    with pytest.raises(ValueError, match="'hidden_size': 8.*'hidden_size': 16"):
        wide.load_checkpoint(str(tmp_path / "ckpt"))


def test_export_hf_folder(tmp_path, tiny_model_path):
    from transformers import AutoTokenizer

    engine = FakeTrainEngine(EngineSpec(model_path=str(tiny_model_path)), FakeTrainConfig(hidden_size=8))
    engine.export_hf(str(tmp_path / "hf"))
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["vocab_size"] == json.loads((tiny_model_path / "config.json").read_text())["vocab_size"]
    assert config["hidden_size"] == 8 and config["model_type"] == "rlcore_tiny_lm"
    saved = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert set(saved) == {n for n, _ in engine.model.named_parameters()}
    for name, p in engine.model.named_parameters():
        assert torch.equal(saved[name], p.detach())
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert len(tok) == config["vocab_size"]


def test_fixed_costs_sleep(monkeypatch):
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    engine = FakeTrainEngine(
        EngineSpec(**SPEC), FakeTrainConfig(vocab_size=50, step_cost_s=0.25, infer_cost_s=0.125)
    )
    batch = contract_batch(2, vocab_low=3, vocab_high=50)
    engine.train_step(batch, token_nll_loss)
    engine.infer(batch)
    assert slept == [0.25, 0.125]
    with pytest.raises(ValueError, match="fake.step_cost_s must be >= 0"):
        FakeTrainConfig(step_cost_s=-1)


def test_empty_batch_infer_and_rank_without_rows():
    engine = make()
    empty = contract_batch(2, vocab_low=3, vocab_high=50).index([])
    out = engine.infer(empty, ["log_probs", "entropy"])
    assert isinstance(out, Batch) and tuple(out["log_probs"].shape) == (0, empty["responses"].shape[1])
    metrics = engine.train_step(empty, token_nll_loss)
    assert metrics["loss"] == 0 and metrics["grad_norm"] == 0

"""Worker processes for the LoRA tests of the megatron engine (spawned by ``mcore_testlib.spawn``): real
``MegatronEngine`` instances with adapters on gloo, whose adapter streams, log-probs, merged weights and
checkpoints ``test_lora.py`` checks against PEFT on the Hugging Face model."""

from __future__ import annotations

from pathlib import Path

from mcore_test_workers import _engine, _export, _infer, _save, _setup

RANK, ALPHA = 4, 8.0


def _adapter(engine):
    """The adapter stream in fp32, reassembled."""
    import torch
    from rlcore.weights import assemble

    return {name: t.clone() for name, t in assemble(engine.export_adapter(torch.float32, 64 * 1024))}


def tp2(rank, world, port, qwen, batches, work_dir):
    """TP=2: two steps of a rank-4 adapter on every linear layer; the adapter after each, log-probs with
    and without it, the merged weights, a checkpoint round trip; then an adapter on q_proj and v_proj
    only."""
    _setup()
    from mcore_testlib import nll_loss
    from megatron.core import parallel_state as mpu
    from rlcore.api import LoraSpec

    b1, b2 = batches
    work = Path(work_dir)
    r = {}
    spec = LoraSpec(rank=RANK, alpha=ALPHA)
    eng = _engine(qwen, rank, world, port, tp=2, lora=spec)
    r["holds"] = eng.holds_output()
    r["adapter0"] = _adapter(eng)
    r["metrics1"] = eng.train_step(b1, nll_loss)
    r["adapter1"] = _adapter(eng)
    r["metrics2"] = eng.train_step(b2, nll_loss)
    r["adapter2"] = _adapter(eng)
    r["infer2"] = _infer(eng, b1, ("log_probs", "base_log_probs"))
    r["merged2"] = _export(eng)
    eng.save_checkpoint(str(work / "ckpt"))
    eng.export_hf(str(work / "hf"))
    del eng
    fresh = _engine(qwen, rank, world, port, tp=2, lora=spec)
    fresh.load_checkpoint(str(work / "ckpt"))
    r["adapter2_reloaded"] = _adapter(fresh)
    plain = _engine(qwen, rank, world, port, tp=2)
    try:
        plain.load_checkpoint(str(work / "ckpt"))
    except ValueError as exc:
        r["full_from_lora_error"] = str(exc)
    del fresh, plain

    some = _engine(qwen, rank, world, port, tp=2, lora=LoraSpec(RANK, ALPHA, ("q_proj", "v_proj")))
    some.train_step(b1, nll_loss)
    some.train_step(b2, nll_loss)
    r["some_adapter2"] = _adapter(some)
    r["some_merged2"] = _export(some)
    del some
    mpu.destroy_model_parallel()
    _save(r, work, "lora_tp2", rank)

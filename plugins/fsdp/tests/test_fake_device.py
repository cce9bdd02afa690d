"""The FSDP engine on a device platform that is not ``cpu`` or ``cuda`` (``fake``, CPU-backed, from
rlcore.testing): it takes device, backend and mesh from the platform, trains, infers and releases
through it, and its log-probs match a float64 Hugging Face reference."""

import fsdp_support as fs
import torch
from rlcore.api import DistInfo
from rlcore.devices import get_platform
from rlcore.testing.fake_device import FakeDevicePlatform
from rlcore_fsdp.config import FSDPConfig
from rlcore_fsdp.engine import FSDPEngine
from transformers import AutoModelForCausalLM


def test_fsdp_engine_on_the_fake_platform(tiny_model_path):
    FakeDevicePlatform.calls.clear()
    platform = get_platform("fake")
    spec = fs.spec(str(tiny_model_path), dtype="float64")
    engine = FSDPEngine(spec, FSDPConfig(), platform, DistInfo())
    assert engine.platform.name == "fake" and FakeDevicePlatform.calls["set_device"] == 1

    batch = fs.batch()
    out = engine.infer(batch, ("log_probs", "entropy"))
    model64 = AutoModelForCausalLM.from_pretrained(str(tiny_model_path), dtype=torch.float64).eval()
    want_lp, want_ent = fs.hf_reference(model64, batch, spec.temperature)
    mask = batch["response_mask"].bool()
    assert torch.allclose(out["log_probs"][mask].double(), want_lp[mask], atol=1e-9)
    assert torch.allclose(out["entropy"][mask].double(), want_ent[mask], atol=1e-9)

    losses = [engine.train_step(batch, fs.nll_entropy_loss)["loss"] for _ in range(3)]
    assert losses[-1] < losses[0]
    engine.release(["weights", "optimizer"])
    engine.resume(["weights", "optimizer"])
    assert FakeDevicePlatform.calls["empty_cache"] >= 1
    after = engine.infer(batch, ("log_probs",))["log_probs"]
    assert not torch.allclose(after[mask].double(), want_lp[mask], atol=1e-6)  # the steps changed it

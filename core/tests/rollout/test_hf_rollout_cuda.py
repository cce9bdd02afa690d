"""HFRollout on a CUDA device, both decode paths: the same references as on CPU, plus device RNG and
memory release."""

import pytest
import torch
from rlcore.api import RolloutSpec, SamplingParams
from rlcore.devices import get_platform
from rlcore.rollout.config import HFRolloutConfig
from rlcore.rollout.hf import HFRollout
from transformers import AutoModelForCausalLM

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module", params=["loop", "generate"])
def engine(tiny_model, request):
    platform = get_platform("cuda")
    platform.set_device(0)
    return HFRollout(RolloutSpec(model_path=tiny_model), HFRolloutConfig(decode=request.param), platform)


PROMPTS = [[5, 17, 300, 42, 7, 99], [9], [100, 200, 300]]


def test_greedy_and_sampled_log_probs_on_cuda(engine, tiny_model):
    assert engine.device == torch.device("cuda", 0)
    model64 = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float64).eval()
    greedy = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=10))
    for prompt, (c,) in zip(PROMPTS, greedy, strict=True):
        ids, want = list(prompt), []
        for _ in range(10):  # argmax token by token in float64 on the CPU
            with torch.no_grad():
                token = int(model64(torch.tensor([ids])).logits[0, -1].argmax())
            want.append(token)
            ids.append(token)
            if token in engine.eos_ids:
                break
        assert c.token_ids == want
    sampled = engine.generate(PROMPTS, SamplingParams(n=2, temperature=0.9, top_k=20, max_tokens=10, seed=1))
    for prompt, group in zip(PROMPTS, sampled, strict=True):
        for c in group:
            ids = torch.tensor([prompt + c.token_ids])
            with torch.no_grad():
                logits = model64(ids).logits[0, len(prompt) - 1 : -1] / 0.9
            want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
            assert c.log_probs == pytest.approx(want.tolist(), abs=1e-3)  # TF32/fused kernels on GPU


def test_seeded_and_leaves_the_cuda_rng_alone(engine):
    params = SamplingParams(n=4, temperature=1.0, max_tokens=8, seed=3)
    state = torch.cuda.get_rng_state()
    first = engine.generate(PROMPTS, params)
    assert torch.equal(torch.cuda.get_rng_state(), state)
    again = engine.generate(PROMPTS, params)
    assert [[c.token_ids for c in g] for g in first] == [[c.token_ids for c in g] for g in again]


def test_release_moves_weights_off_the_gpu(engine):
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    engine.release(["weights", "kv_cache"])
    assert torch.cuda.memory_allocated() < held - 4 * 2**20  # the 5.8 MB model left the GPU
    engine.resume(["weights", "kv_cache"])
    assert next(engine.model.parameters()).device == torch.device("cuda", 0)
    assert len(engine.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=3))[0][0].token_ids) == 3

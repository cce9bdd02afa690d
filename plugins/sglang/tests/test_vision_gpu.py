"""SGLang with images on a CUDA GPU: log-probs of responses to prompts with images match plain transformers
in float64 on the model's own processor's inputs, the prompt comes back as the processor expands it, and
new vision-tower weights reach the images' embeddings (SGLang's image-embedding cache is off for vision
models: it is keyed by the image and never dropped at a weight update). Tiny Qwen2.5-VL and Qwen3-VL
(rlcore.testing.tiny_vlm), fp32. Skipped without a CUDA GPU or sglang (CI); run on the lent GPU machine
(python -m benchmarks.gpu vision-tests-sglang)."""

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
    pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="needs sglang (CUDA machines)"),
]

#: fp32 SGLang on a GPU against the float64 forward (its GPU kernels, TF32 where it allows it).
LOGPROB_ATOL = 2e-3


@pytest.mark.parametrize("architecture", ["qwen2_5_vl", "qwen3_vl"])
def test_sglang_log_probs_with_images_match_float64_transformers(tmp_path_factory, architecture):
    from rlcore_sglang.config import SGLangConfig
    from rlcore_sglang.engine import SGLangRollout

    path = build_tiny_vlm(tmp_path_factory.getbasetemp() / f"tiny-{architecture}", architecture=architecture)
    spec = RolloutSpec(model_path=str(path), dtype="float32", max_model_len=512, seed=0)
    engine = SGLangRollout(spec, SGLangConfig(mem_fraction_static=0.2), get_platform("cuda"))
    try:
        before, after = check_across_a_vision_sync(engine, path, LOGPROB_ATOL)
        print(
            f"{architecture}: largest |sglang - float64| log-prob {before:.2e}, after a vision sync {after:.2e}"
        )
    finally:
        engine.shutdown()

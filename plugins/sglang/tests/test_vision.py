"""The SGLang rollout's image requests against a stand-in for SGLang's tokenizer manager (no sglang here;
the GPU test ``test_vision_gpu.py`` checks the log-probs against float64 transformers). The stand-in
expands the image tokens with the model's own processor, as SGLang's does, and echoes the prompt it read:
each row goes with its own images (none for a text row), the image tokens are banned by ``logit_bias``,
the completion reports the prompt as the engine expanded it, and a text-only batch goes through
``async_generate`` unchanged."""

import dataclasses
import sys
import types

import pytest
from rlcore.api import SamplingParams
from rlcore.testing.tiny_vlm import build_tiny_vlm, solid_image
from rlcore.vision import VisionInputs, image_parts
from rlcore.vision.inputs import BANNED_LOGIT
from rlcore_sglang.config import SGLangConfig
from rlcore_sglang.engine import SGLangRollout
from rlcore_sglang.engine_loop import EngineLoop
from rlcore_sglang.memory import MemoryTags


@dataclasses.dataclass
class GenerateReqInput:
    input_ids: list
    sampling_params: list
    return_logprob: bool
    image_data: list | None = None
    return_prompt_token_ids: bool = False
    rid: list | None = None


class Manager:
    def __init__(self, vision: VisionInputs):
        self.vision = vision
        self.requests: list[GenerateReqInput] = []

    def generate_request(self, obj, request):
        self.requests.append(obj)

        async def results():
            out = []
            for ids, images in zip(obj.input_ids, obj.image_data, strict=True):
                expanded = ids
                if images:  # as SGLang's processor does: the folder's processor on the decoded text
                    text = self.vision.tokenizer.decode(ids)
                    expanded = list(self.vision.processor(text=[text], images=images)["input_ids"][0])
                meta = {"finish_reason": {"type": "length"}, "output_token_logprobs": [(-0.5, 7, None)]}
                out.append({"text": "", "output_ids": [7], "meta_info": meta, "prompt_token_ids": expanded})
            yield out

        return results()


class FakeSGLang:
    def __init__(self, vision):
        self.tokenizer_manager = Manager(vision)
        self.text_calls: list[dict] = []

    async def async_generate(self, input_ids, sampling_params, return_logprob, **kwargs):
        self.text_calls.append({"input_ids": input_ids, "sampling_params": sampling_params})
        meta = {"finish_reason": {"type": "length"}, "output_token_logprobs": [(-0.5, 7, None)]}
        return [{"text": "", "output_ids": [7], "meta_info": meta} for _ in input_ids]


@pytest.fixture
def rollout(tmp_path, monkeypatch):
    module = types.ModuleType("sglang.srt.managers.io_struct")
    module.GenerateReqInput = GenerateReqInput
    for name in ("sglang", "sglang.srt", "sglang.srt.managers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.managers.io_struct", module)
    vision = VisionInputs.for_model(build_tiny_vlm(tmp_path / "vlm"))
    engine = SGLangRollout.__new__(SGLangRollout)  # no sglang: the parts under test only
    engine.config = SGLangConfig()
    engine.memory = MemoryTags(memory_saver=False, weights_backup=False, cuda_graph=False)
    engine.vocab_size, engine.max_model_len = len(vision.tokenizer), 256
    engine._warned_seed = True
    engine.vision = vision
    engine.adapter = None
    engine._loop = EngineLoop(lambda: FakeSGLang(vision))
    yield engine
    engine._loop.close()


def _prompt(vision, images: int) -> list[int]:
    messages = image_parts([{"role": "user", "content": "<image>" * images + "Colour?"}], images, "row")
    text = vision.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return vision.tokenizer(text)["input_ids"]


def test_each_row_goes_with_its_images_and_comes_back_expanded(rollout):
    vision = rollout.vision
    red, blue = solid_image((255, 0, 0)), solid_image((0, 0, 255), (84, 56))
    prompts = [_prompt(vision, 1), _prompt(vision, 0), _prompt(vision, 2)]
    media = [{"image": [red]}, None, {"image": [red, blue]}]
    out = rollout.generate(prompts, SamplingParams(n=2, max_tokens=1), multi_modal=media)
    (request,) = rollout._loop.engine.tokenizer_manager.requests
    # One request per sample, each with its prompt's images; the text row's list is empty.
    assert [len(images) for images in request.image_data] == [1, 1, 0, 0, 2, 2]
    assert request.return_prompt_token_ids is True
    banned = {str(t): BANNED_LOGIT for t in vision.banned_token_ids}
    assert all(p["logit_bias"] == banned for p in request.sampling_params)
    for prompt, m, samples in zip(prompts, media, out, strict=True):
        expanded, _ = vision.prompt_inputs(prompt, m)  # rlcore's own expansion, as the trainer reads it
        assert [c.prompt_ids for c in samples] == [expanded, expanded]
    assert len(out[0][0].prompt_ids) > len(prompts[0])  # the image's tokens were expanded
    assert rollout._loop.engine.text_calls == []


def test_a_batch_without_images_takes_the_plain_call(rollout):
    prompt = _prompt(rollout.vision, 0)
    out = rollout.generate([prompt], SamplingParams(n=1, max_tokens=1), multi_modal=[None])
    (call,) = rollout._loop.engine.text_calls
    assert call["input_ids"] == [prompt] and out[0][0].prompt_ids == prompt
    # Image tokens are banned whenever a vision model generates, with images or without.
    assert set(call["sampling_params"][0]["logit_bias"]) == {str(t) for t in rollout.vision.banned_token_ids}
    assert rollout._loop.engine.tokenizer_manager.requests == []

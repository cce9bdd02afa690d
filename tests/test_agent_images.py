"""Multi-turn agent episodes over prompts with images (issue 54): every model turn's request carries the
prompt's images, the episode's prompt is the one the engine expanded, and each model turn's log-probs are
those of plain transformers in float64 reading the whole episode with the images (the model's own
processor's inputs). The tiny Qwen2.5-VL is first fitted to answer the prompt with a tool call (random
weights write none), so the episodes really have a second turn after a tool observation."""

import pytest
import torch
from rlcore.agents.episode import AgentLoop, EpisodeLimits
from rlcore.agents.observations import Observations
from rlcore.agents.tools import build_tools
from rlcore.api import RolloutSpec, SamplingParams
from rlcore.devices import get_platform
from rlcore.rollout.hf import HFRollout
from rlcore.testing.tiny_vlm import build_tiny_vlm, fit_tiny_vlm_answer, solid_image
from rlcore.testing.vision_logprobs import float64_log_probs
from rlcore.vision import VisionInputs, image_parts

#: The prompt the fitted model answers with a call; a call without a name is still a call: the episode
#: runs it, gets the tool's error message back as the observation, and the model writes a second turn.
PROMPT = "<image>Add the numbers: 2 + 3"
CALL = "<tool_call>{}</tool_call>"
#: fp32 HF rollout against the float64 forward (tests/test_vision_rollouts.py measured below 1e-6).
LOGPROB_ATOL = 1e-4


@pytest.fixture(scope="module")
def caller(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    tiny = build_tiny_vlm(base / "tiny-qwen2_5_vl")
    return fit_tiny_vlm_answer(tiny, base / "tiny-vlm-caller", PROMPT, solid_image((255, 0, 0)), CALL)


def _episodes(model_path, images, n=2, wrap=lambda engine: engine):
    """``n`` episodes of the prompt with ``images`` on the HF rollout (``wrap``: a stand-in around it)."""
    vision = VisionInputs.for_model(model_path)
    engine = HFRollout(RolloutSpec(model_path=str(model_path), max_model_len=256), None, get_platform("cpu"))
    loop = AgentLoop(
        wrap(engine),
        vision.tokenizer,
        build_tools(["calculator"]),
        EpisodeLimits(max_turns=2, max_model_len=256),
        Observations(vision.tokenizer, 16),
    )
    messages = image_parts([{"role": "user", "content": PROMPT}], len(images), "row")
    text = vision.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt = vision.tokenizer(text)["input_ids"]
    media = {"image": images}
    (episodes,) = loop.run([prompt], SamplingParams(n=n, max_tokens=96, seed=1), [media])
    return vision, text, prompt, media, episodes


def test_every_model_turn_of_an_episode_reads_the_prompts_images(caller):
    image = solid_image((255, 0, 0))
    vision, text, prompt, media, episodes = _episodes(caller, [image])
    expanded = list(vision.processor(text=[text], images=[image])["input_ids"][0])
    assert len(expanded) > len(prompt)  # the image token became the image's tokens
    for c in episodes:
        # Two model turns around one observation: the call, the tool's message, the second turn.
        assert c.info["turns"] == 2 and c.info["tool_calls"] == 1, c.info
        assert c.prompt_ids == expanded  # the prompt as the engine expanded it: what the trainer reads
        mask = c.response_mask
        first_obs = mask.index(0)
        assert 0 < first_obs and 1 in mask[first_obs:], mask
        assert vision.tokenizer.decode(c.token_ids[:first_obs], skip_special_tokens=False).startswith(CALL)
    # Each model turn's log-probs are float64 transformers' on the whole episode with the image; the
    # observation's tokens carry none.
    reference = float64_log_probs(caller, vision, [text], [media], [episodes])
    for c, ref in zip(episodes, reference, strict=True):
        got = torch.tensor(c.log_probs, dtype=torch.float64)
        model = torch.tensor(c.response_mask, dtype=torch.bool)
        assert float((got - ref)[model].abs().max()) < LOGPROB_ATOL
        assert bool((got[~model] == 0).all())


def test_an_episode_whose_later_turns_read_another_image_fails_the_same_check(caller):
    """The check above can fail: an engine that reads another image on the later turns (a stale image
    cache, say) writes second turns whose log-probs are not the float64 forward's with the prompt's image."""
    image, other = solid_image((255, 0, 0)), solid_image((0, 0, 255))

    class StaleImage:
        """The HF rollout, reading ``other`` instead of the request's image after the first request."""

        def __init__(self, engine):
            self.engine, self.spec, self.calls = engine, engine.spec, 0

        async def agenerate(self, prompt, params, *, multi_modal=None):
            self.calls += 1
            media = multi_modal if self.calls == 1 else {"image": [other]}
            return await self.engine.agenerate(prompt, params, multi_modal=media)

    vision, text, _, media, episodes = _episodes(caller, [image], n=1, wrap=StaleImage)
    (c,) = episodes
    assert c.info["turns"] == 2, c.info
    (ref,) = float64_log_probs(caller, vision, [text], [media], [episodes])
    got = torch.tensor(c.log_probs, dtype=torch.float64)
    observation = c.response_mask.index(0)
    second = torch.tensor([m == 1 and t > observation for t, m in enumerate(c.response_mask)])
    assert float((got - ref)[second].abs().max()) > 100 * LOGPROB_ATOL

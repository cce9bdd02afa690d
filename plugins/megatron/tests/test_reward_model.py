"""The reward-model provider on the Megatron engine's ``score`` head (one gloo process, the CPU
redirection of the test workers), loading a ``Qwen2ForSequenceClassification`` folder with a
tokenizer of its own: the scores equal a float64 Hugging Face forward of each re-templated row alone."""

from __future__ import annotations

import mcore_reward_worker
import pytest
import torch
from mcore_testlib import ATOL, spawn
from rlcore.api import Completion
from rlcore.rollout.batching import completions_to_batch
from rlcore.testing.tiny_reward import build_tiny_reward_model

PROMPTS = ["What is 12 + 30?", "count 3 apples", "hello", "please solve the question step by step", "a"]
RESPONSES = ["The answer is 42. #### 42", "3", "hello world, the model says hello", "", "the sum is 60"]


def policy_batch(tok):
    completions = []
    for prompt, response in zip(PROMPTS, RESPONSES, strict=True):
        text = tok.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        prompt_ids = tok(text, add_special_tokens=False)["input_ids"]
        ids = tok(response, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        completions.append(Completion(prompt_ids, ids, [0.0] * len(ids), "stop", response))
    batch = completions_to_batch(completions, tok.pad_token_id)
    batch.objects["raw_prompt"] = [[{"role": "user", "content": p}] for p in PROMPTS]
    return batch


@pytest.fixture(scope="module")
def run(tiny_qwen, tmp_path_factory):
    from transformers import AutoTokenizer

    work = tmp_path_factory.mktemp("megatron_rm")
    rm = build_tiny_reward_model(work / "rm", tokenizer="own")
    batch = policy_batch(AutoTokenizer.from_pretrained(tiny_qwen))
    out = work / "scores.pt"
    spawn(mcore_reward_worker.score_with_provider, 1, str(rm), str(tiny_qwen), batch, str(out))
    return torch.load(out, weights_only=False), batch, rm


def test_megatron_scores_the_reward_models_own_tokens_like_hf_in_float64(run):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    results, batch, rm = run
    assert not results["reuse_ids"]  # the reward model has a tokenizer of its own
    rm_tok = AutoTokenizer.from_pretrained(rm)
    rows = [
        rm_tok(f"<|im_start|>user: {p}\n<|im_start|>assistant: {r}\n<|im_end|>", add_special_tokens=False)[
            "input_ids"
        ]
        for p, r in zip(PROMPTS, RESPONSES, strict=True)
    ]
    mask = results["inputs"]["attention_mask"].bool()
    assert [results["inputs"]["input_ids"][i][mask[i]].tolist() for i in range(len(rows))] == rows
    model = AutoModelForSequenceClassification.from_pretrained(rm, dtype=torch.float64).eval()
    with torch.no_grad():
        want = torch.stack([model(torch.tensor([r])).logits[0, 0] for r in rows])
    assert want.std() > 0.1
    torch.testing.assert_close(results["scores"].double(), want, rtol=0, atol=ATOL)
    last = batch["response_mask"].sum(-1) - 1
    placed = results["token_level_scores"][torch.arange(len(rows)), last]
    torch.testing.assert_close(placed, results["scores"], rtol=0, atol=0)

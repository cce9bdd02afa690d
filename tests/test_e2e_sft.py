"""Supervised fine-tuning with the real FSDP engine: the first step's loss is the token-mean NLL a plain
Hugging Face model computes (float64), and after a few dozen steps the exported model, loaded back in
transformers, answers the built-in task's prompts (greedy decoding)."""

from __future__ import annotations

import pytest
import torch
from rlcore.api import EngineSpec
from rlcore.cluster import LocalGroup, TrainRole
from rlcore.tasks import copy_word, resolve_files
from rlcore.trainer.sft import SFTTrainer, load_sft_examples, sft_batch

pytest.importorskip("rlcore_fsdp")
transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@torch.no_grad()
def hf_token_mean_nll(model, examples) -> float:
    """Float64 NLL of every response token, example by example, without padding."""
    total, count = 0.0, 0
    for e in examples:
        ids = torch.tensor([e.prompt_ids + e.response_ids])
        logp = torch.log_softmax(model(ids).logits[0].double(), -1)
        for k, token in enumerate(e.response_ids):
            total -= float(logp[len(e.prompt_ids) - 1 + k, token])
            count += 1
    return total / count


@torch.no_grad()
def greedy_accuracy(model, tokenizer, examples) -> float:
    right = 0
    for e, (_, word) in zip(examples, copy_word.prompts(), strict=True):
        out = model.generate(
            torch.tensor([e.prompt_ids]),
            max_new_tokens=4,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        text = tokenizer.decode(out[0, len(e.prompt_ids) :], skip_special_tokens=True)
        right += copy_word.compute_score(copy_word.DATA_SOURCE, text, word) == 1.0
    return right / len(examples)


def test_sft_with_fsdp_teaches_the_builtin_task(tmp_path, tiny_model_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_path)
    examples = load_sft_examples(resolve_files(["builtin:copy_word/sft.jsonl"], tmp_path), tokenizer)
    assert len(examples) == 64
    spec = EngineSpec(model_path=str(tiny_model_path), lr=5e-4, micro_batch_size=16)
    role = TrainRole("actor", LocalGroup.train("actor", "fsdp", spec, device="cpu"))
    try:
        trainer = SFTTrainer(role, examples, batch_size=32, pad_token_id=tokenizer.pad_token_id)
        first_batch = SFTTrainer(role, examples, batch_size=32, pad_token_id=0).next_examples()
        history = trainer.fit(30)
        role.export_hf(str(tmp_path / "sft"))
    finally:
        role.shutdown()

    before = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path, torch_dtype=torch.float64)
    reference = hf_token_mean_nll(before, first_batch)
    assert history[0]["sft/loss"] == pytest.approx(reference, rel=1e-4)
    assert history[0]["sft/tokens"] == float(sft_batch(first_batch, 0)["response_mask"].sum())
    assert history[-1]["sft/loss"] < 0.3 * history[0]["sft/loss"]

    after = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "sft")
    assert greedy_accuracy(before.float(), tokenizer, examples) == 0.0
    assert greedy_accuracy(after, tokenizer, examples) >= 0.8

"""Supervised fine-tuning through a train role: the NLL loss against a float64 loop, the batch layout,
reading prompt/response files, the example order, and learning on the fake engine."""

from __future__ import annotations

import json
import math

import pytest
import torch
from rlcore.api import Batch, EngineSpec
from rlcore.cluster import LocalGroup, TrainRole
from rlcore.data import DataError
from rlcore.trainer.sft import NLLLoss, SFTExample, SFTTrainer, load_sft_examples, sft_batch


@pytest.fixture(scope="module")
def tokenizer():
    from rlcore.testing.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()


def test_nll_loss_matches_a_float64_loop():
    torch.manual_seed(0)
    log_probs = -torch.rand(3, 4, dtype=torch.float32) * 3
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    micro = Batch({"response_mask": mask})
    expected = -sum(float(log_probs[i, j]) for i in range(3) for j in range(4) if mask[i, j]) / 7
    loss, metrics = NLLLoss()({"log_probs": log_probs}, micro)
    assert math.isclose(float(loss), expected, rel_tol=1e-6)
    assert math.isclose(metrics["sft/nll"], expected, rel_tol=1e-6)
    # Normalised by the mini-batch's tokens over all ranks when the controller says so.
    micro.meta["global_tokens"] = 20
    loss, metrics = NLLLoss()({"log_probs": log_probs}, micro)
    assert math.isclose(float(loss), expected * 7 / 20, rel_tol=1e-6)
    assert math.isclose(metrics["sft/nll"], expected, rel_tol=1e-6)
    with pytest.raises(KeyError, match="policy head"):
        NLLLoss()({"values": log_probs}, micro)


def test_sft_batch_layout():
    batch = sft_batch([SFTExample([5, 6, 7], [8, 2]), SFTExample([9], [10, 11, 2])], pad_token_id=0)
    assert batch["prompts"].tolist() == [[5, 6, 7], [0, 0, 9]]
    assert batch["responses"].tolist() == [[8, 2, 0], [10, 11, 2]]
    assert batch["response_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 2, 0], [0, 0, 9, 10, 11, 2]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 4], [0, 0, 0, 1, 2, 3]]


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_examples_are_rendered_as_rl_prompts_and_end_with_eos(tmp_path, tokenizer):
    rows = [{"prompt": [{"role": "user", "content": "Say apple"}], "response": "apple"}]
    (example,) = load_sft_examples([write_rows(tmp_path / "a.jsonl", rows)], tokenizer)
    text = tokenizer.apply_chat_template(rows[0]["prompt"], add_generation_prompt=True, tokenize=False)
    assert example.prompt_ids == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert example.response_ids == [tokenizer.convert_tokens_to_ids("apple"), tokenizer.eos_token_id]
    assert tokenizer.decode(example.prompt_ids).endswith("<|im_start|>assistant\n")
    raw = load_sft_examples(
        [write_rows(tmp_path / "b.jsonl", [{"q": "Say apple", "a": "apple"}])],
        tokenizer,
        prompt_key="q",
        response_key="a",
        apply_chat_template=False,
    )
    assert raw[0].prompt_ids == tokenizer("Say apple")["input_ids"]


@pytest.mark.parametrize(
    ("row", "kwargs", "message"),
    [
        (
            {"prompt": [{"role": "user", "content": "x"}]},
            {},
            "(line 2): column 'response' must hold the response text",
        ),
        ({"prompt": "Say apple", "response": "apple"}, {}, "column 'prompt' must hold chat messages"),
        ({"prompt": [{"content": "x"}], "response": "a"}, {}, "column 'prompt' must hold chat messages"),
        (
            {"prompt": [{"role": "user", "content": "x"}], "response": "apple banana cherry"},
            {"max_response_length": 3},
            "the response is 4 tokens long, over sft.max_response_length=3",
        ),
        (
            {"prompt": [{"role": "user", "content": "apple " * 10}], "response": "a"},
            {"max_prompt_length": 14},
            "over data.max_prompt_length=14",
        ),
    ],
)
def test_bad_rows_are_named(tmp_path, tokenizer, row, kwargs, message):
    good = {"prompt": [{"role": "user", "content": "Say apple"}], "response": "apple"}
    path = write_rows(tmp_path / "bad.jsonl", [good, row])
    with pytest.raises(DataError) as info:
        load_sft_examples([path], tokenizer, **kwargs)
    assert message in str(info.value) and "bad.jsonl" in str(info.value) and "row 1" in str(info.value)


def test_no_files_is_an_error(tokenizer):
    with pytest.raises(DataError, match="set sft.files"):
        load_sft_examples([], tokenizer)


class RecordingRole:
    """Takes ``train`` calls like a TrainRole and remembers the batches' first prompt token."""

    def __init__(self):
        self.seen = []

    def train(self, batch, loss_fn, *, mini_batch_size=None):
        assert mini_batch_size is None and isinstance(loss_fn, NLLLoss)
        self.seen.append(batch["prompts"][:, -1].tolist())
        return {"loss": 1.0, "grad_norm": 2.0, "lr": 0.1, "other": 3.0}


def test_each_epoch_visits_every_example_once_in_a_seeded_order():
    examples = [SFTExample([i], [100, 2]) for i in range(10)]
    role = RecordingRole()
    trainer = SFTTrainer(role, examples, batch_size=4, pad_token_id=0, seed=3)
    history = trainer.fit(5)  # 20 examples: two epochs
    seen = [t for batch in role.seen for t in batch]
    assert all(len(b) == 4 for b in role.seen)
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:]) == list(range(10))
    assert seen[:10] != seen[10:]  # reshuffled
    assert history[0] == {
        "sft/loss": 1.0,
        "sft/grad_norm": 2.0,
        "sft/lr": 0.1,
        "sft/tokens": 8.0,
        "sft/epoch": 0.0,
    }
    assert history[-1]["sft/epoch"] == 1.0
    again = RecordingRole()
    SFTTrainer(again, examples, batch_size=4, pad_token_id=0, seed=3).fit(5)
    assert again.seen == role.seen
    # A set smaller than a batch is used whole.
    small = RecordingRole()
    SFTTrainer(small, examples[:3], batch_size=8, pad_token_id=0).fit(2)
    assert [sorted(b) for b in small.seen] == [[0, 1, 2], [0, 1, 2]]


def test_sft_on_the_fake_engine_learns_the_responses():
    # Prompts ending in token i must be answered with token 10 + i, then eos (2).
    examples = [SFTExample([1, 3 + i], [20 + i, 2]) for i in range(6)]
    spec = EngineSpec(model_path="", dtype="float64", lr=0.05, micro_batch_size=4)
    role = TrainRole("actor", LocalGroup.train("actor", "fake", spec, device="cpu"))
    batch = sft_batch(examples, pad_token_id=0)

    def nll() -> float:  # float64 token mean over every example, from the engine's log-probs
        lp = role.infer(batch, ("log_probs",))["log_probs"].double()
        mask = batch["response_mask"].double()
        return float(-(lp * mask).sum() / mask.sum())

    before = nll()
    trainer = SFTTrainer(role, examples, batch_size=6, pad_token_id=0)
    history = trainer.fit(40)
    # The first step's loss is the NLL of the untrained model on the whole set.
    assert math.isclose(history[0]["sft/loss"], before, rel_tol=1e-9)
    assert nll() < 0.2 * before
    assert history[-1]["sft/loss"] < history[0]["sft/loss"]

"""PromptLoader: batch layout, seeded shuffling, drop_last, validation passes and mid-epoch resume."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from rlcore.data import DataConfig, DataError, PromptLoader, RLDataset, build_train_loader, build_val_loader


@pytest.fixture
def dataset(tokenizer, write, rows):
    data = rows(10)
    # Different prompt lengths, so left-padding is visible.
    for i, r in enumerate(data):
        r["prompt"][0]["content"] = "apple " * i + f"What is {i} + {i}?"
    return RLDataset([write("train.parquet", data)], tokenizer, DataConfig())


def take(loader, n):
    return list(itertools.islice(iter(loader), n))


def indices(batches):
    return [b["index"] for b in batches]


def test_batch_layout_left_padded(dataset, tokenizer):
    loader = PromptLoader(dataset, 4, shuffle=False)
    batch = next(iter(loader))
    assert sorted(batch.tensors) == ["attention_mask", "prompt_mask", "prompts"]
    assert sorted(batch.objects) == [
        "ability",
        "data_source",
        "extra_info",
        "ground_truth",
        "index",
        "raw_prompt",
        "reward_model",
    ]
    assert batch["index"] == [0, 1, 2, 3]
    expected = [dataset[i]["input_ids"].tolist() for i in range(4)]
    width = max(len(e) for e in expected)
    assert batch["prompts"].shape == (4, width)
    assert batch["prompts"].dtype == torch.long
    for r, ids in enumerate(expected):
        pad = width - len(ids)
        assert batch["prompts"][r].tolist() == [tokenizer.pad_token_id] * pad + ids
        assert batch["prompt_mask"][r].tolist() == [0] * pad + [1] * len(ids)
    assert torch.equal(batch["attention_mask"], batch["prompt_mask"])
    assert batch["ground_truth"] == ["0", "2", "4", "6"]
    assert batch["raw_prompt"][1] == [{"role": "user", "content": "apple What is 1 + 1?"}]
    assert batch.meta["epoch"] == 0


def test_drop_last(dataset):
    assert len(PromptLoader(dataset, 4, drop_last=True)) == 2
    keep = PromptLoader(dataset, 4, shuffle=False, drop_last=False)
    assert len(keep) == 3
    assert [len(b) for b in keep] == [4, 4, 2]


def test_seeded_shuffle_is_deterministic_per_epoch(dataset):
    a = PromptLoader(dataset, 5, seed=3, drop_last=False)
    b = PromptLoader(dataset, 5, seed=3, drop_last=False)
    epochs_a = [indices(list(a)) for _ in range(3)]
    epochs_b = [indices(list(b)) for _ in range(3)]
    assert epochs_a == epochs_b
    for epoch, batches in enumerate(epochs_a):
        flat = [i for batch in batches for i in batch]
        assert sorted(flat) == list(range(10))  # each epoch visits every prompt once
        assert flat == np.random.default_rng([3, epoch]).permutation(10).tolist()
    assert epochs_a[0] != epochs_a[1]  # a new order each epoch
    other = PromptLoader(dataset, 5, seed=4, drop_last=False)
    assert indices(list(other)) != epochs_a[0]


def test_unshuffled_order_is_file_order(dataset):
    loader = PromptLoader(dataset, 3, shuffle=False, drop_last=False)
    assert indices(list(loader)) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


def batches_equal(x, y):
    assert x["index"] == y["index"]
    assert torch.equal(x["prompts"], y["prompts"])
    assert torch.equal(x["attention_mask"], y["attention_mask"])
    assert x["raw_prompt"] == y["raw_prompt"]
    assert x.meta == y.meta


@pytest.mark.parametrize("stop_after", [0, 1, 3, 4, 5])
def test_resume_mid_epoch_yields_the_uninterrupted_sequence(dataset, stop_after):
    # 3 batches per epoch (drop_last): stop_after=3 is an epoch boundary, 4 and 5 are inside epoch 1.
    reference = PromptLoader(dataset, 3, seed=7)
    expected = [b for _ in range(3) for b in reference]
    assert len(expected) == 9

    first = PromptLoader(dataset, 3, seed=7)
    seen = []
    while len(seen) < stop_after:
        for batch in first:
            seen.append(batch)
            if len(seen) == stop_after:
                break
    state = json.loads(json.dumps(first.state_dict()))  # what a checkpoint stores

    resumed = PromptLoader(dataset, 3, seed=7)
    resumed.load_state_dict(state)
    while len(seen) < 9:
        seen.extend(resumed)
    assert len(seen) == 9
    for got, want in zip(seen, expected, strict=True):
        batches_equal(got, want)


def test_state_at_epoch_end_points_to_next_epoch(dataset):
    loader = PromptLoader(dataset, 5, seed=1)
    batches = take(loader, 2)  # the whole epoch, generator not resumed past its last batch
    assert len(batches) == 2
    assert loader.state_dict()["epoch"] == 1
    assert loader.state_dict()["batches_taken"] == 0
    assert loader.epoch == 1
    assert [b.meta["epoch"] for b in loader] == [1, 1]


def test_resume_refuses_changed_data_or_settings(dataset, tokenizer, write, rows):
    loader = PromptLoader(dataset, 3, seed=7)
    take(loader, 1)
    state = loader.state_dict()
    with pytest.raises(DataError, match=r"cannot resume the train data loader: seed: checkpoint 7, now 8"):
        PromptLoader(dataset, 3, seed=8).load_state_dict(state)
    smaller = RLDataset([write("small.jsonl", rows(9))], tokenizer, DataConfig())
    with pytest.raises(
        DataError, match=r"num_prompts: checkpoint 10, now 9.*Restore the original data files"
    ):
        PromptLoader(smaller, 3, seed=7).load_state_dict(state)


def test_too_few_prompts_for_one_batch(dataset):
    with pytest.raises(
        DataError,
        match=r"the train set has 10 prompts, fewer than one batch of 16.*"
        r"Lower data\.train_batch_size",
    ):
        PromptLoader(dataset, 16, drop_last=True)
    assert len(PromptLoader(dataset, 16, drop_last=False)) == 1


def test_build_loaders_from_config(tokenizer, write, rows):
    train = write("train.jsonl", rows(12))
    val = write("val.parquet", rows(5))
    config = DataConfig(train_files=[train], val_files=[val], train_batch_size=4, val_batch_size=2, seed=5)
    loader = build_train_loader(config, tokenizer)
    assert len(loader) == 3
    assert indices(list(loader)) == [
        b.tolist() for b in np.split(np.random.default_rng([5, 0]).permutation(12), 3)
    ]
    val_loader = build_val_loader(config, tokenizer)
    passes = [indices(list(val_loader.full_pass())) for _ in range(2)]
    assert passes[0] == passes[1] == [[0, 1], [2, 3], [4]]
    whole = build_val_loader(DataConfig(train_files=[train], val_files=[val]), tokenizer)
    assert indices(list(whole.full_pass())) == [[0, 1, 2, 3, 4]]
    assert build_val_loader(DataConfig(train_files=[train]), tokenizer) is None

"""A loader batch carries what the rule reward provider reads: data source, ground truth, extra info."""

from __future__ import annotations

import torch
from rlcore.data import DataConfig, build_train_loader
from rlcore.rewards import RewardConfig
from rlcore.rewards.rule_provider import RuleRewardProvider


def test_prompts_from_files_are_scored_against_their_ground_truth(tokenizer, write, rows):
    data = rows(6)
    data[4]["data_source"] = "lighteval/MATH"
    data[4]["reward_model"]["ground_truth"] = "\\frac{1}{2}"
    config = DataConfig(train_files=[write("mix.parquet", data)], train_batch_size=6, seed=2)
    batch = next(iter(build_train_loader(config, tokenizer)))

    # Responses a rollout might produce: right for even dataset rows, wrong for odd ones.
    texts, truth_by_index = [], {}
    for index, source, truth in zip(batch["index"], batch["data_source"], batch["ground_truth"], strict=True):
        truth_by_index[index] = truth
        answer = truth if index % 2 == 0 else "999"
        texts.append(f"\\boxed{{{answer}}}" if source == "lighteval/MATH" else f"#### {answer}")
    batch.objects["response_text"] = texts
    batch.tensors["response_mask"] = torch.ones(6, 4, dtype=torch.long)

    out = RuleRewardProvider(RewardConfig(num_workers=0)).score(batch)
    expected = [1.0 if index % 2 == 0 else 0.0 for index in batch["index"]]
    assert out["token_level_scores"][:, -1].tolist() == expected
    assert all(truth_by_index[i] == data[i]["reward_model"]["ground_truth"] for i in batch["index"])
    batch.update(out)
    assert "token_level_scores" in batch and "prompts" in batch

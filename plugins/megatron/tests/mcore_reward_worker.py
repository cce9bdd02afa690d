"""Worker process of the megatron reward-model test (spawned by ``mcore_testlib.spawn``): the reward
provider over a ``MegatronEngine`` with the ``score`` head, loaded from a sequence-classification folder."""

from __future__ import annotations


def score_with_provider(rank, world, port, rm_path, policy_path, batch, out_file):
    """Score ``batch`` with :class:`ModelRewardProvider` over a TP=PP=DP=1 Megatron engine (the provider
    only needs ``infer``, which one rank answers); save what the reward model read and its scores."""
    from mcore_test_workers import _engine, _setup

    _setup()
    import torch
    from rlcore.rewards.model_config import RewardModelConfig
    from rlcore.rewards.model_provider import EXTRA_KEY, ModelRewardProvider
    from transformers import AutoTokenizer

    engine = _engine(rm_path, rank, world, port, head="score", trainable=False, micro_batch_size=3)
    config = RewardModelConfig(enabled=True, model_path=rm_path, engine="megatron", micro_batch_size=3)
    provider = ModelRewardProvider(engine, config, AutoTokenizer.from_pretrained(policy_path))
    inputs = provider.inputs(batch)
    out = provider.score(batch)
    torch.save(
        {
            "inputs": dict(inputs.tensors),
            "scores": torch.tensor([e[EXTRA_KEY] for e in out["reward_extra_info"]]),
            "token_level_scores": out["token_level_scores"],
            "reuse_ids": provider.reuse_ids,
        },
        out_file,
    )

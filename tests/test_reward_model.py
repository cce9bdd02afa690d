"""The reward-model provider on the FSDP engine's score head (a train role in this process), against
an independent float64 Hugging Face ``AutoModelForSequenceClassification`` forward, one row at a time.

Both input paths: a reward model with the policy's tokenizer scores the policy's token ids as they are;
one with its own tokenizer and chat template scores the re-templated, re-tokenized text.
"""

from __future__ import annotations

import attrs
import pytest
import torch
from rlcore.api import Completion
from rlcore.api.batch import Batch
from rlcore.cluster.roles import make_train_role
from rlcore.config import load_config
from rlcore.rewards import RewardConfig, RuleRewardProvider
from rlcore.rewards.model_config import RewardModelConfig, reward_model_spec
from rlcore.rewards.model_provider import EXTRA_KEY, ModelRewardProvider
from rlcore.rollout.batching import completions_to_batch
from rlcore.testing.tiny_reward import build_tiny_reward_model

PROMPTS = [
    "What is 12 + 30?",
    "count 3 apples",
    "hello",
    "please solve the question step by step",
    "what is the sum of 7 and 8 and 9",
    "reverse the list",
    "a",
]
RESPONSES = [
    "The answer is 42. #### 42",
    "3",
    "hello world, the model says hello",
    "step one: think. step two: the result equals 5.",
    "",
    "cherry banana apple",
    "the final reasoning is long so the answer is 10 and 20 and 30 #### 60",
]

SCORER = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(solution_str)) / 10.0
"""


@pytest.fixture(scope="module")
def policy_tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def policy_batch(tok, prompts=PROMPTS, responses=RESPONSES) -> Batch:
    """What a generate phase hands the reward: the policy's chat-templated prompt ids, response ids with
    EOS (truncated rows without), ``raw_prompt`` messages and ``response_text``."""
    completions = []
    for k, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        messages = [{"role": "user", "content": prompt}]
        prompt_ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt_ids = tok(prompt_ids, add_special_tokens=False)["input_ids"]
        ids = tok(response, add_special_tokens=False)["input_ids"]
        finish = "length" if k == 1 else "stop"
        ids = ids + ([] if finish == "length" else [tok.eos_token_id])
        completions.append(Completion(prompt_ids, ids, [0.0] * len(ids), finish, response))
    batch = completions_to_batch(completions, tok.pad_token_id)
    batch.objects["raw_prompt"] = [[{"role": "user", "content": p}] for p in prompts]
    batch.objects["data_source"] = ["test/length"] * len(prompts)
    batch.objects["ground_truth"] = [None] * len(prompts)
    return batch


def hf_scores(path, rows: list[list[int]]) -> torch.Tensor:
    """float64 ``AutoModelForSequenceClassification`` on each row alone; HF reads the last non-pad token."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float64).eval()
    pad = model.config.pad_token_id
    out = []
    with torch.no_grad():
        for row in rows:
            assert row[-1] != pad  # so HF's "last non-pad token" is the row's last token, as for the engine
            out.append(model(torch.tensor([row])).logits[0, 0])
    return torch.stack(out)


def rm_role(path, micro_batch_size=3):
    config = load_config(
        None,
        [
            "reward_model.enabled=true",
            f"reward_model.model_path={path}",
            f"reward_model.micro_batch_size={micro_batch_size}",
        ],
    )
    spec = reward_model_spec(config)
    return make_train_role("reward_model", "fsdp", spec, backend="local", device="cpu"), config.reward_model


@pytest.fixture(scope="module")
def same_rm(tmp_path_factory):
    path = build_tiny_reward_model(tmp_path_factory.mktemp("rm-same") / "rm", tokenizer="policy")
    role, config = rm_role(path)
    yield path, role, config
    role.shutdown()


@pytest.fixture(scope="module")
def own_rm(tmp_path_factory):
    path = build_tiny_reward_model(tmp_path_factory.mktemp("rm-own") / "rm", tokenizer="own")
    role, config = rm_role(path)
    yield path, role, config
    role.shutdown()


def test_same_tokenizer_scores_the_policy_ids_like_hf_in_float64(same_rm, policy_tokenizer):
    path, role, config = same_rm
    provider = ModelRewardProvider(role, config, policy_tokenizer)
    assert provider.reuse_ids
    batch = policy_batch(policy_tokenizer)
    sent = provider.inputs(batch)
    assert torch.equal(sent["input_ids"], batch["input_ids"])  # the policy's ids, not a re-tokenization
    out = provider.score(batch)
    mask = batch["attention_mask"].bool()
    rows = [batch["input_ids"][i][mask[i]].tolist() for i in range(len(batch))]
    want = hf_scores(path, rows)
    got = torch.tensor([e[EXTRA_KEY] for e in out["reward_extra_info"]], dtype=torch.float64)
    # fp32 engine vs fp64 reference over 2 layers of width 128: errors of order 1e-6 relative.
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert want.std() > 0.1  # the scores really differ between rows
    scores = out["token_level_scores"]
    last = batch["response_mask"].sum(-1) - 1
    for i in range(len(batch)):
        if batch["response_mask"][i].any():
            assert scores[i, last[i]] == pytest.approx(float(got[i]), abs=1e-6)
            assert scores[i].count_nonzero() <= 1
        else:
            assert not scores[i].any()  # an empty response carries no reward
    metrics = out.meta["metrics"]
    assert metrics["reward_model/retokenized"] == 0.0
    assert metrics["reward_model/score_mean"] == pytest.approx(float(got.mean()), abs=1e-6)


def test_own_tokenizer_retemplates_and_scores_like_hf_in_float64(own_rm, policy_tokenizer):
    from transformers import AutoTokenizer

    path, role, config = own_rm
    provider = ModelRewardProvider(role, config, policy_tokenizer)
    assert not provider.reuse_ids
    batch = policy_batch(policy_tokenizer)
    rm_tok = AutoTokenizer.from_pretrained(path)
    # What the reward model reads, written out by hand from its template.
    texts = [
        f"<|im_start|>user: {p}\n<|im_start|>assistant: {r}\n<|im_end|>"
        for p, r in zip(PROMPTS, RESPONSES, strict=True)
    ]
    rows = [rm_tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    assert rows[0] != batch["input_ids"][0][batch["attention_mask"][0].bool()].tolist()
    sent = provider.inputs(batch)
    mask = sent["attention_mask"].bool()
    assert [sent["input_ids"][i][mask[i]].tolist() for i in range(len(batch))] == rows
    out = provider.score(batch)
    got = torch.tensor([e[EXTRA_KEY] for e in out["reward_extra_info"]], dtype=torch.float64)
    torch.testing.assert_close(got, hf_scores(path, rows), rtol=1e-4, atol=1e-4)
    assert out.meta["metrics"]["reward_model/retokenized"] == 1.0


def test_raw_text_prompts_are_joined_with_the_response(own_rm, policy_tokenizer):
    path, role, config = own_rm
    provider = ModelRewardProvider(role, config, policy_tokenizer)
    batch = policy_batch(policy_tokenizer)
    batch.objects["raw_prompt"] = list(PROMPTS)
    assert provider.text(batch, 0) == PROMPTS[0] + RESPONSES[0]
    del batch.objects["raw_prompt"]  # not carried: decoded from the policy's prompt ids
    assert provider.text(batch, 2) == "user\nhello\nassistant\n" + RESPONSES[2]


def test_add_combines_with_the_rule_reward_on_the_last_model_token(same_rm, policy_tokenizer, tmp_path):
    path, role, config = same_rm
    scorer = tmp_path / "length.py"
    scorer.write_text(SCORER)
    rule = RuleRewardProvider(RewardConfig(custom_function_path=str(scorer), num_workers=0))
    provider = ModelRewardProvider(role, attrs.evolve(config, combine="add"), policy_tokenizer, rule=rule)
    batch = policy_batch(policy_tokenizer)
    # A multi-turn row: tool-observation tokens (mask 0) in the middle and after the last model turn.
    mask = batch["response_mask"].clone()
    mask[3, 2:5] = 0
    mask[3, int(batch["response_mask"][3].sum()) - 2 :] = 0
    batch.tensors["response_mask"] = mask
    out = provider.score(batch)
    rm = torch.tensor([e[EXTRA_KEY] for e in out["reward_extra_info"]])
    rule_scores = torch.tensor([len(r) / 10.0 for r in RESPONSES])
    scores = out["token_level_scores"]
    for i in range(len(batch)):
        valid = mask[i].nonzero().flatten()
        if len(valid) == 0:
            assert not scores[i].any()
            continue
        last = int(valid[-1])
        assert scores[i, last] == pytest.approx(float(rm[i] + rule_scores[i]), abs=1e-5)
        assert scores[i].count_nonzero() == 1
    assert out.meta["metrics"]["reward/errors"] == 0.0
    rows_with_tokens = mask.any(-1)
    assert out.meta["metrics"]["reward_model/rule_score_mean"] == pytest.approx(
        float(rule_scores[rows_with_tokens].sum() / len(batch)), abs=1e-6
    )


def test_add_without_a_rule_provider_is_refused(same_rm, policy_tokenizer):
    path, role, config = same_rm
    with pytest.raises(ValueError, match="combine=add needs the rule provider"):
        ModelRewardProvider(role, attrs.evolve(config, combine="add"), policy_tokenizer)


def test_config_default_is_replace():
    assert RewardModelConfig().combine == "replace"


def test_an_input_longer_than_the_reward_models_positions_is_refused(same_rm, policy_tokenizer):
    path, role, config = same_rm
    provider = ModelRewardProvider(role, config, policy_tokenizer)
    assert provider.max_length == 2048  # from the folder's config.json
    provider.max_length = 20
    batch = policy_batch(policy_tokenizer)
    longest = int(batch["attention_mask"].sum(-1).argmax())
    with pytest.raises(ValueError, match=f"input for batch row {longest} has .* max_position_embeddings=20"):
        provider.score(batch)

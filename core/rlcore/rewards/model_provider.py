"""The reward-model provider: a sequence-classification model scores each prompt + response on a worker
group of its own (the ``reward_model`` role), as verl's reward-model worker does.

The provider runs on the driver and sends the role one forward-only batch per step; the role's train
engine (any plugin with the ``score`` head) splits it over its ranks and into micro-batches of
``reward_model.micro_batch_size``, runs in eval mode without gradients, and returns the scalar of the
classification head at each sequence's last real token (``num_labels = 1``).

What the reward model reads (:meth:`ModelRewardProvider.inputs`):

- **same tokenizer** (the reward model's vocabulary and chat template equal the policy's): the batch's
  own ``input_ids``/``attention_mask``/``position_ids [B, P+R]``, the policy's token ids as generated;
- **another tokenizer**: each sample's prompt messages (``raw_prompt``) plus an assistant turn holding
  ``response_text`` are rendered with the reward model's chat template and tokenized with its tokenizer
  (a raw-text prompt is joined with the response as text), then left-padded.

The sequence score lands on the last response token of ``token_level_scores [B, R]``
(:func:`~rlcore.api.reward.place_sequence_scores`). With ``reward_model.combine: add`` the rule
provider's ``token_level_scores`` are added to it; with ``replace`` they are not computed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from rlcore.api.batch import Batch
from rlcore.api.reward import RewardProvider, place_sequence_scores
from rlcore.rewards.model_config import RewardModelConfig, load_rm_tokenizer

#: Key of each sample's reward-model score in ``reward_extra_info`` (DAPO's filter may name it).
EXTRA_KEY = "rm_score"


def same_tokenizer(a: Any, b: Any) -> bool:
    """Whether token ids of tokenizer ``a`` mean the same text, in the same chat format, to ``b``: equal
    vocabularies (added tokens included) and equal chat templates."""
    if a is b:
        return True
    return a.get_vocab() == b.get_vocab() and getattr(a, "chat_template", None) == getattr(
        b, "chat_template", None
    )


def pad_id(tokenizer: Any) -> int:
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    raise ValueError("the reward model's tokenizer has neither a pad nor an EOS token to pad batches with")


def left_padded(rows: list[list[int]], pad: int) -> Batch:
    """``input_ids``, ``attention_mask``, ``position_ids [B, T]`` of token rows, left-padded (``T`` the
    longest row); positions count real tokens from 0, as in the policy's batches."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if not row:
            raise ValueError(f"reward model input of row {i} is empty")
        ids[i, width - len(row) :] = torch.as_tensor(row, dtype=torch.long)
        mask[i, width - len(row) :] = 1
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": position_ids})


class ModelRewardProvider(RewardProvider):
    """Scores a batch with the reward model behind ``role`` (a train role of the ``score`` head: anything
    with ``infer(batch, ("scores",)) -> Batch`` holding ``scores [B]``).

    ``policy_tokenizer`` decoded the policy's samples; ``rm_tokenizer`` defaults to the one in
    ``config.tokenizer_path`` or ``config.model_path``. ``rule``: the provider whose scores are added
    under ``combine: add``. The role belongs to the caller (the trainer shuts it down with the others);
    :meth:`close` closes ``rule``.

    Returns ``token_level_scores [B, R]`` (float32), objects ``reward_extra_info`` (each sample's
    ``rm_score``, beside what the rule scorer returned) and ``meta["metrics"]``:
    ``reward_model/score_mean``, ``_std``, ``_min``, ``_max``, ``reward_model/retokenized`` (1 when the
    reward model reads its own tokenization) and ``reward_model/seconds``; under ``add`` also the rule
    provider's metrics and ``reward_model/rule_score_mean``.
    """

    def __init__(
        self,
        role: Any,
        config: RewardModelConfig,
        policy_tokenizer: Any,
        *,
        rm_tokenizer: Any = None,
        rule: RewardProvider | None = None,
    ):
        if config.combine == "add" and rule is None:
            raise ValueError("reward_model.combine=add needs the rule provider to add to the model's scores")
        self.role, self.config, self.rule = role, config, rule
        self.policy_tokenizer = policy_tokenizer
        self.rm_tokenizer = rm_tokenizer if rm_tokenizer is not None else load_rm_tokenizer(config)
        #: the policy's token ids are scored as they are (no decode and re-tokenization)
        self.reuse_ids = same_tokenizer(policy_tokenizer, self.rm_tokenizer)
        #: the longest input the reward model has positions for (``None``: its config does not say)
        self.max_length = _max_positions(config.model_path)

    # -- scoring ---------------------------------------------------------------------------------
    def score(self, batch: Batch) -> Batch:
        # The model scores in the calling thread, then the rule: with trainer.backend=local the engine runs
        # in this process, and its device and torch function modes belong to the thread that built it.
        start = time.perf_counter()
        scores = self.model_scores(batch)
        seconds = time.perf_counter() - start
        mask = batch["response_mask"]
        token_scores = place_sequence_scores(scores, mask)
        extra: list[dict[str, Any]] = [{} for _ in range(len(batch))]
        metrics: dict[str, float] = {}
        if self.config.combine == "add":
            ruled = self.rule.score(batch)
            rule_scores = ruled["token_level_scores"].to(torch.float32)
            # Both sit on each row's last response token; a row without one has neither.
            token_scores = token_scores + rule_scores
            extra = [dict(e) for e in ruled.get("reward_extra_info") or extra]
            metrics.update(ruled.meta.get("metrics", {}))
            metrics["reward_model/rule_score_mean"] = float(rule_scores.double().sum(-1).mean())
        for i, value in enumerate(scores.tolist()):
            extra[i][EXTRA_KEY] = value
        metrics.update(self._metrics(scores, seconds))
        return Batch(
            {"token_level_scores": token_scores}, {"reward_extra_info": extra}, meta={"metrics": metrics}
        )

    def model_scores(self, batch: Batch) -> torch.Tensor:
        """The reward model's score of each row, ``[B]`` float32."""
        if len(batch) == 0:
            return torch.zeros(0)
        scores = self.role.infer(self.inputs(batch), ("scores",))["scores"]
        return scores.detach().to(torch.float32).cpu()

    def inputs(self, batch: Batch) -> Batch:
        """What the reward model reads for ``batch``: ``input_ids``, ``attention_mask``, ``position_ids``
        ``[B, T]`` (see the module docstring for the two cases)."""
        if self.reuse_ids:
            inputs = batch.select("input_ids", "attention_mask", "position_ids")
        else:
            inputs = left_padded(self.token_rows(batch), pad_id(self.rm_tokenizer))
        lengths = inputs["attention_mask"].sum(-1)
        if self.max_length is not None and int(lengths.max()) > self.max_length:
            row = int(lengths.argmax())
            raise ValueError(
                f"the reward model's input for batch row {row} has {int(lengths[row])} tokens, more than its "
                f"max_position_embeddings={self.max_length} ({self.config.model_path}); lower "
                "data.max_prompt_length or rollout.max_response_length, or use a reward model with a longer "
                "context"
            )
        return inputs

    def token_rows(self, batch: Batch) -> list[list[int]]:
        """Each sample's prompt + response in the reward model's tokenization and chat format."""
        tok = self.rm_tokenizer
        texts = [self.text(batch, i) for i in range(len(batch))]
        chat = [isinstance(t, list) for t in texts]
        rows: list[list[int]] = [[] for _ in texts]
        rendered = [i for i, c in enumerate(chat) if c]
        if rendered:
            # The template writes every special token itself (BOS included where the model has one).
            strings = tok.apply_chat_template([texts[i] for i in rendered], tokenize=False)
            ids = tok(strings, add_special_tokens=False)["input_ids"]
            for i, row in zip(rendered, ids, strict=True):
                rows[i] = list(row)
        plain = [i for i, c in enumerate(chat) if not c]
        if plain:
            ids = tok([texts[i] for i in plain])["input_ids"]
            for i, row in zip(plain, ids, strict=True):
                rows[i] = list(row)
        return rows

    def text(self, batch: Batch, row: int) -> list[dict[str, str]] | str:
        """Sample ``row`` as the reward model sees it before tokenization: the prompt's chat messages
        plus ``{"role": "assistant", "content": response_text}``, or prompt text + response text when
        the prompt is raw text (``data.apply_chat_template: false``) or not carried (then decoded from the
        policy's prompt ids, special tokens dropped)."""
        response = str(batch["response_text"][row])
        prompts = batch.get("raw_prompt")
        prompt = prompts[row] if prompts is not None else None
        if isinstance(prompt, list | tuple) and prompt and all(isinstance(m, dict) for m in prompt):
            if getattr(self.rm_tokenizer, "chat_template", None) is None:
                raise ValueError(
                    "the reward model's tokenizer differs from the policy's and has no chat template to render "
                    "the prompt's messages with; set reward_model.tokenizer_path to a tokenizer with one"
                )
            return [dict(m) for m in prompt] + [{"role": "assistant", "content": response}]
        if not isinstance(prompt, str):
            ids, mask = batch["prompts"][row], batch["attention_mask"][row, : batch["prompts"].shape[1]]
            prompt = self.policy_tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True)
        return prompt + response

    def _metrics(self, scores: torch.Tensor, seconds: float) -> dict[str, float]:
        s = scores.double()
        n = s.numel()
        return {
            "reward_model/score_mean": float(s.mean()) if n else 0.0,
            "reward_model/score_std": float(s.std()) if n > 1 else 0.0,
            "reward_model/score_min": float(s.min()) if n else 0.0,
            "reward_model/score_max": float(s.max()) if n else 0.0,
            "reward_model/retokenized": 0.0 if self.reuse_ids else 1.0,
            "reward_model/seconds": seconds,
        }

    def close(self) -> None:
        if self.rule is not None:
            self.rule.close()


def _max_positions(model_path: str | None) -> int | None:
    file = Path(model_path or "") / "config.json"
    value = json.loads(file.read_text()).get("max_position_embeddings") if file.is_file() else None
    return int(value) if value else None

"""End to end: GRPO and PPO whose reward comes from a tiny sequence-classification reward model on a Ray
worker of its own (local Ray cluster, FSDP actor, HF rollout, all colocated on this machine's CPUs).

Each step's scored batch is kept (a pass-through wrapper around the run's provider) and its scores are
recomputed here with a float64 Hugging Face model, one row at a time: the reward the algorithm consumed
is the reward model's, and its metrics are finite.
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path

import pytest
import torch
from rlcore.cluster import start_ray, stop_ray
from rlcore.testing.tiny_reward import build_tiny_reward_model
from rlcore.trainer.loop import Trainer
from rlcore.trainer.run import prepare_run

pytestmark = pytest.mark.slow

_spec = importlib.util.spec_from_file_location(
    "trainer_task", Path(__file__).parents[1] / "core" / "tests" / "trainer" / "trainer_task.py"
)
task = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(task)


class Recording:
    """The run's reward provider, keeping every batch it scored (the batch object the step goes on with)."""

    def __init__(self, inner):
        self.inner, self.batches = inner, []

    def score(self, batch):
        self.batches.append(batch)
        return self.inner.score(batch)

    def close(self):
        self.inner.close()


@pytest.fixture(scope="module")
def ray_cluster():
    info = start_ray(num_cpus=2)
    yield info
    stop_ray()


def reference_scores(path: Path, rows: list[list[int]]) -> torch.Tensor:
    """float64 ``AutoModelForSequenceClassification``: its score head on the hidden state of each row's
    last token (the row alone, unpadded)."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float64).eval()
    with torch.no_grad():
        return torch.stack(
            [model.score(model.model(torch.tensor([r])).last_hidden_state[0, -1])[0] for r in rows]
        )


def rm_rows(batch, tokenizer: str, rm_path: Path) -> list[list[int]]:
    """What the reward model must have read for each row of ``batch``."""
    mask = batch["attention_mask"].bool()
    if tokenizer == "policy":  # the policy's ids as generated
        return [batch["input_ids"][i][mask[i]].tolist() for i in range(len(batch))]
    from transformers import AutoTokenizer

    rm_tok = AutoTokenizer.from_pretrained(rm_path)
    rows = []
    for messages, response in zip(batch["raw_prompt"], batch["response_text"], strict=True):
        turns = [*messages, {"role": "assistant", "content": response}]
        text = "".join(f"<|im_start|>{m['role']}: {m['content']}\n" for m in turns) + "<|im_end|>"
        rows.append(rm_tok(text, add_special_tokens=False)["input_ids"])
    return rows


def run(tmp_path: Path, tiny_model_path: Path, algorithm: str, tokenizer: str, combine: str, ranks: int):
    rm_path = build_tiny_reward_model(tmp_path / f"rm-{tokenizer}", tokenizer=tokenizer)
    files = task.write_task(tmp_path / "task")
    config = task.task_config(
        tmp_path,
        files,
        algorithm,
        engine="fsdp",
        rollout__engine="hf",
        model__path=tiny_model_path,
        trainer__backend="ray",
        trainer__experiment_name=f"{algorithm}-rm",
        trainer__total_steps=2,
        trainer__val_before_train="false",
        trainer__save_freq=0,
        data__val_files="[]",
        rollout__max_response_length=12,
        transport__check_prompts=0,
        actor__optim__lr=0.01,
        reward_model__enabled="true",
        reward_model__model_path=rm_path,
        reward_model__micro_batch_size=5,
        reward_model__world_size=ranks,
        reward_model__combine=combine,
    )
    config, run_dir, _ = prepare_run(config)
    trainer = Trainer(config, run_dir)
    try:
        recording = Recording(trainer.ctx.reward)
        trainer.ctx.reward = recording
        trainer.fit()
        role = recording.inner.role
        workers = role.group.ping()
        timings = role.group.call_all("last_timings")
    finally:
        trainer.close()
    return trainer, recording, workers, timings, rm_path


@pytest.mark.parametrize(
    "algorithm, tokenizer, combine, ranks",
    [("grpo", "own", "replace", 2), ("ppo", "policy", "add", 1)],
)
def test_reward_model_scores_on_its_own_worker_and_the_algorithm_consumes_them(
    tmp_path, tiny_model_path, ray_cluster, algorithm, tokenizer, combine, ranks
):
    trainer, recording, workers, timings, rm_path = run(
        tmp_path, tiny_model_path, algorithm, tokenizer, combine, ranks
    )
    # The reward model ran in Ray worker processes of its own role (for GRPO two FSDP ranks, each
    # scoring its share of every batch), and scored there.
    assert [(w["role"], w["rank"]) for w in workers] == [("reward_model", r) for r in range(ranks)]
    assert all(w["pid"] != os.getpid() and w["placement_group"] is not None for w in workers)
    assert len({w["pid"] for w in workers}) == ranks
    assert all("infer" in t for t in timings)

    records = [r for r in trainer.history if r["step"] > 0]
    assert len(records) == 2 and len(recording.batches) == 2
    for record, batch in zip(records, recording.batches, strict=True):
        want = reference_scores(rm_path, rm_rows(batch, tokenizer, rm_path))
        if combine == "add":  # the task's rule: the fraction of digit characters
            want = want + torch.tensor(
                [sum(c.isdigit() for c in t) / len(t) if t else 0.0 for t in batch["response_text"]],
                dtype=torch.float64,
            )
        has_tokens = batch["response_mask"].any(-1)
        got = batch["token_level_scores"].double().sum(-1)
        torch.testing.assert_close(got[has_tokens], want[has_tokens], rtol=1e-4, atol=1e-4)
        assert want[has_tokens].std() > 0.05  # responses got different rewards
        # The algorithm consumed these scores: its reward metric is their mean, and its advantages moved.
        assert record["reward/mean"] == pytest.approx(float(got.mean()), abs=1e-5)
        assert record["reward_model/retokenized"] == (1.0 if tokenizer == "own" else 0.0)
        assert "advantages" in batch and batch["advantages"].abs().sum() > 0
        finite = [k for k, v in record.items() if not math.isfinite(v)]
        assert finite == [], finite
        assert math.isfinite(record["actor/pg_loss"]) and record["actor/grad_norm"] > 0
        if algorithm == "ppo":
            assert math.isfinite(record["critic/vf_loss"])

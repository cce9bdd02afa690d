"""The rollout stream with the real HF rollout engine: what is cut, carried and trained.

* a response cut at one step and finished at the next carries both versions, and each of its log-probs
  is the float64 log-prob of its token under the weights of the version that sampled it;
* the schedule depends only on seeds and token counts: the same stream twice gives the same groups,
  tokens and metrics;
* no over-sampling: every step trains exactly the groups it admitted, nothing is carried;
* the staleness bound: a group older than ``max_staleness`` is dropped and its prompt generated again;
* the selection policies are registered plugins; a policy that breaks the contract is named;
* a resumed stream regenerates the prompts that were in flight, none lost or doubled.
"""

from __future__ import annotations

import pytest
import torch
from rlcore.api import Batch, RolloutSpec
from rlcore.config import load_config
from rlcore.devices import get_platform
from rlcore.flows.context import MemoryPlan, StepContext
from rlcore.plugins import registry
from rlcore.rollout.config import HFRolloutConfig
from rlcore.rollout.hf import HFRollout
from rlcore.stream import RolloutStream, read_stream
from rlcore.stream.policies import Fifo, FinishOrder
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

TEMPERATURE = 0.8
MAX_TOKENS = 12
N = 2
#: Every token whose text holds an "e" ends a response: lengths from 1 to the cap, varied (measured on
#: the tiny tokenizer: about a third of responses per 3 tokens).
STOP = "[e]"
PROMPTS = [[3, 14, 15, 9, 2], [6, 5, 35], [7, 8, 9], [10, 11], [12, 4, 4, 30], [21, 22], [40, 41, 42], [5, 6]]


class Role:
    """The rollout role's face over one engine: ``generate``, counting calls."""

    def __init__(self, engine):
        self.engine, self.calls = engine, 0

    def generate(self, prompts, params):
        self.calls += 1
        return self.engine.generate(prompts, params)


class Prompts:
    """``PROMPTS`` over and over, as a loader of ``size``-row batches whose rows carry ``index``."""

    def __init__(self, size: int):
        self.size, self.drawn = size, 0

    def rows(self, indices):
        return [_collate([i]) for i in indices]

    def __call__(self) -> Batch:
        batch = _collate(list(range(self.drawn, self.drawn + self.size)))
        self.drawn += self.size
        return batch


def _collate(indices: list[int]) -> Batch:
    ids = [PROMPTS[i % len(PROMPTS)] for i in indices]
    width = max(map(len, ids))
    prompts = torch.zeros((len(ids), width), dtype=torch.long)
    mask = torch.zeros_like(prompts)
    for r, row in enumerate(ids):
        prompts[r, width - len(row) :] = torch.tensor(row)
        mask[r, width - len(row) :] = 1
    return Batch(
        {"prompts": prompts, "prompt_mask": mask, "attention_mask": mask.clone()}, {"index": indices}
    )


def length_score(ctx, batch: Batch) -> Batch:
    """A real (if simple) reward: the response length, on its last token."""
    scores = torch.zeros(batch["response_mask"].shape)
    lengths = batch["response_mask"].sum(-1)
    scores[torch.arange(len(batch)), (lengths - 1).clamp(min=0)] = lengths.float()
    batch.tensors["token_level_scores"] = scores
    return batch


def context(role, draw, seed=0) -> StepContext:
    tokenizer = role.engine.tokenizer
    config = load_config(
        overrides=[
            f"rollout.n={N}",
            f"rollout.max_response_length={MAX_TOKENS}",
            f"rollout.temperature={TEMPERATURE}",
            f"rollout.stop={STOP}",
        ]
    )
    return StepContext(
        config=config,
        preset=None,
        actor=None,
        rollout=role,
        reward=None,
        tokenizer=tokenizer,
        pad_token_id=0,
        memory=MemoryPlan(False, role, {}),
        transport=None,
        next_prompts=draw,
        seed=seed,
    )


def stream(draw, *, batch_size=2, over_sampling=4, chunk=3, staleness=4, policy=None, keep=None, log=None):
    return RolloutStream(
        batch_size=batch_size,
        over_sampling=over_sampling,
        chunk_tokens=chunk,
        max_staleness=staleness,
        policy=policy or Fifo(),
        draw=draw,
        rows=draw.rows,
        finish=length_score,
        keep=keep or (lambda ctx, group: True),
        log_path=log,
    )


def run_steps(s: RolloutStream, ctx: StepContext, steps: int, on_sync=None) -> list[tuple[Batch, dict]]:
    """``steps`` steps of the stream: step k collects under version k - 1, then the weights advance."""
    out = []
    for step in range(1, steps + 1):
        ctx.begin_step(step)
        ctx.version = step - 1
        batch = s.collect(ctx)
        out.append((batch, dict(ctx.metrics)))
        if on_sync is not None:
            on_sync(step)
    return out


@pytest.fixture(scope="module")
def engine(tiny_model):
    return HFRollout(RolloutSpec(model_path=tiny_model), HFRolloutConfig(), get_platform("cpu"))


def perturbed(weights: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in weights.items()}


def float64_log_probs(model, weights, prompt: list[int], tokens: list[int]) -> list[float]:
    """Log-prob of each response token under ``weights``, in float64, at the sampling temperature."""
    model.load_state_dict({k: v.double() for k, v in weights.items()}, strict=False)
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].double()
    lp = torch.log_softmax(logits / TEMPERATURE, -1)
    return lp.gather(-1, torch.tensor(tokens)[:, None])[:, 0].tolist()


def test_a_response_cut_at_one_step_and_finished_at_the_next_has_both_versions_and_exact_log_probs(
    engine, tiny_model
):
    weights = {0: load_file(f"{tiny_model}/model.safetensors")}
    for v in range(1, 6):
        weights[v] = perturbed(weights[0], seed=v)
    engine.load_weights([sorted(weights[0].items())])
    draw = Prompts(2)
    s = stream(draw)
    ctx = context(Role(engine), draw)
    steps = run_steps(s, ctx, 5, on_sync=lambda step: engine.load_weights([sorted(weights[step].items())]))

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float64)
    spanning = 0
    for step, (batch, metrics) in enumerate(steps, start=1):
        assert len(batch) == 2 * N
        versions, mask = batch["policy_version"], batch["response_mask"].bool()
        for row in range(len(batch)):
            tokens = batch["responses"][row][mask[row]].tolist()
            seen = versions[row][mask[row]].tolist()
            assert seen == sorted(seen) and max(seen) <= step - 1  # never from weights not yet synced
            width = batch["prompts"].shape[1]
            prompt = batch["prompts"][row][batch["attention_mask"][row][:width].bool()].tolist()
            reference = {v: float64_log_probs(model, weights[v], prompt, tokens) for v in set(seen)}
            expected = [reference[v][t] for t, v in enumerate(seen)]
            got = batch["rollout_log_probs"][row][mask[row]].double()
            torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), atol=2e-4, rtol=0)
            if len(set(seen)) > 1:
                spanning += 1
                # The other versions' log-probs differ: the check tells the versions apart.
                wrong = float64_log_probs(model, weights[seen[0]], prompt, tokens)
                assert max(abs(a - b) for a, b in zip(got.tolist(), wrong, strict=True)) > 1e-2
        lags = {k for k in metrics if k.startswith("stream/tokens_lag/")}
        assert lags and abs(sum(metrics[k] for k in lags) - 1) < 1e-9
    assert spanning > 0, "no trained response was cut at one step and finished at a later one"
    assert any(m["stream/carried_unfinished"] > 0 for _, m in steps)


def _fingerprint(steps):
    return [
        (
            batch["responses"].tolist(),
            batch["policy_version"].tolist(),
            batch.objects["index"],
            batch.objects["uid"],
            {k: v for k, v in metrics.items()},
        )
        for batch, metrics in steps
    ]


def test_the_same_stream_twice_cuts_carries_and_trains_the_same(engine, tiny_model):
    runs = []
    for _ in range(2):
        engine.load_weights([sorted(load_file(f"{tiny_model}/model.safetensors").items())])
        draw = Prompts(3)
        s = stream(draw, batch_size=3, over_sampling=3, chunk=2)
        base = load_file(f"{tiny_model}/model.safetensors")
        runs.append(
            _fingerprint(
                run_steps(
                    s,
                    context(Role(engine), draw),
                    4,
                    on_sync=lambda step, base=base: engine.load_weights(
                        [sorted(perturbed(base, step).items())]
                    ),
                )
            )
        )
    assert runs[0] == runs[1]
    carried = [fp[4]["stream/carried_unfinished"] for fp in runs[0]]
    assert any(carried), "nothing was carried: the comparison would not cover the cut"


def test_without_over_sampling_each_step_trains_what_it_admitted(engine, tiny_model):
    engine.load_weights([sorted(load_file(f"{tiny_model}/model.safetensors").items())])
    draw = Prompts(3)
    s = stream(draw, batch_size=3, over_sampling=0, chunk=2, staleness=0)
    role = Role(engine)
    for step, (batch, metrics) in enumerate(run_steps(s, context(role, draw), 3), start=1):
        assert sorted(set(batch.objects["index"])) == [3 * (step - 1) + i for i in range(3)]
        assert metrics["stream/carried_over"] == 0 and metrics["stream/dropped_stale"] == 0
        assert int(batch["policy_version"][batch["response_mask"].bool()].max()) == step - 1
        assert int(batch["policy_version"][batch["response_mask"].bool()].min()) == step - 1


def test_groups_past_the_staleness_bound_are_dropped_and_their_prompts_generated_again(
    engine, tiny_model, tmp_path
):
    engine.load_weights([sorted(load_file(f"{tiny_model}/model.safetensors").items())])
    draw = Prompts(2)
    # Staleness 0 with over-sampling: every group carried into the next step is already too old.
    s = stream(draw, batch_size=2, over_sampling=4, chunk=2, staleness=0, log=tmp_path / "stream.jsonl")
    steps = run_steps(s, context(Role(engine), draw), 4)
    dropped = sum(m["stream/dropped_stale"] for _, m in steps)
    assert dropped > 0
    for step, (batch, _) in enumerate(steps, start=1):
        seen = batch["policy_version"][batch["response_mask"].bool()]
        assert int(seen.min()) == step - 1  # nothing trained lags
    lines = read_stream(tmp_path / "stream.jsonl")
    assert sum(line["outcome"] == "stale" for line in lines) == dropped
    # Every prompt drawn is trained, in flight, or queued again: dropped prompts are regenerated, not lost.
    trained = [i for batch, _ in steps for i in batch.objects["index"][::N]]
    pending = s.state_dict()["pending"]
    assert sorted(trained + pending) == list(range(draw.drawn))
    assert len(trained) == len(set(trained))


def test_the_resumed_stream_regenerates_what_was_in_flight(engine, tiny_model):
    engine.load_weights([sorted(load_file(f"{tiny_model}/model.safetensors").items())])
    draw = Prompts(2)
    s = stream(draw, batch_size=2, over_sampling=3, chunk=2)
    first = [i for b, _ in run_steps(s, context(Role(engine), draw), 2) for i in b.objects["index"][::N]]
    state = s.state_dict()
    assert state["pending"], "nothing was in flight at the checkpoint"
    resumed = stream(draw, batch_size=2, over_sampling=3, chunk=2)
    resumed.load_state_dict(state)
    ctx = context(Role(engine), draw)
    later = []
    for step, (batch, metrics) in enumerate(run_steps(resumed, ctx, 3), start=1):
        later += batch.objects["index"][::N]
        if step == 1:
            assert metrics["stream/regenerated_on_resume"] == len(state["pending"])
    everything = first + later + resumed.state_dict()["pending"]
    assert sorted(everything) == list(range(draw.drawn)), "a prompt was trained twice or lost"


def test_the_built_in_policies_are_registered_and_order_as_documented():
    assert isinstance(registry("stream_policies").get("fifo")(), Fifo)
    assert isinstance(registry("stream_policies").get("finish_order")(), FinishOrder)

    class G:
        def __init__(self, seq, finished_round):
            self.seq, self.finished_round = seq, finished_round

    groups = [G(0, 5), G(1, 2), G(2, 3), G(3, 2)]
    assert [g.seq for g in Fifo().select(groups, 2, 0)] == [0, 1]
    assert [g.seq for g in FinishOrder().select(groups, 3, 0)] == [1, 3, 2]


def test_a_policy_that_returns_too_few_groups_is_named(engine, tiny_model):
    class Greedy:
        def select(self, finished, need, version):
            return finished[:1]

    engine.load_weights([sorted(load_file(f"{tiny_model}/model.safetensors").items())])
    draw = Prompts(2)
    s = stream(draw, policy=Greedy())
    with pytest.raises(ValueError, match="Greedy returned 1 groups"):
        run_steps(s, context(Role(engine), draw), 1)


def test_a_filter_that_rejects_every_group_stops_with_the_reason(engine, tiny_model):
    engine.load_weights([sorted(load_file(f"{tiny_model}/model.safetensors").items())])
    draw = Prompts(2)
    s = stream(draw, keep=lambda ctx, group: False)
    s.max_filtered = 6
    with pytest.raises(RuntimeError, match="filtered out"):
        run_steps(s, context(Role(engine), draw), 1)

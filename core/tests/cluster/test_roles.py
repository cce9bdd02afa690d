"""Role handles on the fake engines: mini-batch splitting and the global token counts engines receive,
the Ray backend computing what the in-process backend computes, token-balanced shards computing what
consecutive shards compute, weight sync through every transport, release/resume, and rollout order over
several engines."""

import sys
from types import SimpleNamespace

import pytest
import ray.cloudpickle
import torch
from rlcore.api import Batch, EngineSpec, RolloutSpec, SamplingParams
from rlcore.cluster import (
    LocalGroup,
    RayGroup,
    RolloutRole,
    TrainRole,
    WorkerError,
    start_ray,
    stop_ray,
    sync_weights,
)
from rlcore.cluster.roles import resolve_transport_name
from rlcore.cluster.workers import TrainWorker
from rlcore.testing.contract import contract_batch, token_nll_loss
from rlcore.transports import TransportConfig

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

SPEC = EngineSpec(model_path="", dtype="float64", lr=0.05, micro_batch_size=2)
ROLLOUT_SPEC = RolloutSpec(model_path="", dtype="float64")


class RecordingWorker(TrainWorker):
    """A train worker that remembers which rows and meta each ``train_step`` received."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps = []

    def train_step(self, batch, loss_fn):
        self.steps.append((batch["row"].tolist(), dict(batch.meta)))
        metrics = super().train_step(batch, loss_fn)
        return {**metrics, "seen_tokens": float(batch.meta["global_tokens"])}

    def recorded(self):
        return self.steps


def numbered_batch(n: int) -> Batch:
    batch = contract_batch(n, vocab_low=1, vocab_high=200)
    batch.tensors["row"] = torch.arange(n)
    batch.meta.clear()  # the controller sets the counts
    return batch


@pytest.fixture(scope="module")
def ray_session():
    stop_ray()
    yield start_ray(num_cpus=2)
    stop_ray()


@pytest.fixture(scope="module")
def ray_actor(ray_session):
    def kwargs(rank, dist):
        return {"role": "actor", "engine_name": "fake", "spec": SPEC, "dist": dist, "device": "cpu"}

    group = RayGroup("actor", RecordingWorker, kwargs, 2)
    yield TrainRole("actor", group)
    group.shutdown()


@pytest.fixture(scope="module")
def ray_rollout(ray_session):
    role = RolloutRole(RayGroup.rollout("fake", ROLLOUT_SPEC, num_engines=2, device="cpu"))
    yield role
    role.shutdown()


def test_train_splits_mini_batches_and_sets_global_counts(ray_actor):
    batch = numbered_batch(10)
    lengths = batch["response_mask"].sum(1).tolist()  # tokens per row, by row number
    before = [len(steps) for steps in ray_actor.group.call_all("recorded")]
    metrics = ray_actor.train(batch, token_nll_loss, mini_batch_size=4, epochs=2, shuffle_seed=3)
    rank0, rank1 = (s[b:] for s, b in zip(ray_actor.group.call_all("recorded"), before, strict=True))

    assert len(rank0) == len(rank1) == 6  # 2 epochs x mini-batches of 4, 4, 2 rows
    totals = []
    for (rows0, meta0), (rows1, meta1) in zip(rank0, rank1, strict=True):
        mini = rows0 + rows1  # DP rank 0 gets one shard of each mini-batch, rank 1 the other
        assert len(rows0) - len(rows1) in (0, 1)
        tokens = sum(lengths[r] for r in mini)
        assert meta0 == meta1 == {"global_tokens": tokens, "global_sequences": len(mini)}
        totals.append(tokens)
    for epoch in (rank0[:3], rank0[3:]):
        assert [len(rows) for rows, _ in epoch] == [2, 2, 1]
    epochs = [
        [r for (a, _), (b, _) in zip(rank0[i : i + 3], rank1[i : i + 3], strict=True) for r in a + b]
        for i in (0, 3)
    ]
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(10))
    assert epochs[0] != list(range(10)) and epochs[0] != epochs[1]  # shuffled, differently per epoch
    # Metrics: the engine's per-step values averaged over the steps.
    assert metrics["seen_tokens"] == pytest.approx(sum(totals) / len(totals))
    assert {"loss", "grad_norm", "lr", "nll"} <= set(metrics)


def test_train_without_shuffling_or_balancing_keeps_row_order(ray_actor):
    before = [len(steps) for steps in ray_actor.group.call_all("recorded")]
    unbalanced = TrainRole("actor", ray_actor.group, balance_batch=False)
    unbalanced.train(numbered_batch(5), token_nll_loss, mini_batch_size=None)
    (rows0, meta0), (rows1, _) = (
        s[b] for s, b in zip(ray_actor.group.call_all("recorded"), before, strict=True)
    )
    assert (rows0, rows1, meta0["global_sequences"]) == ([0, 1, 2], [3, 4], 5)


def test_ray_backend_trains_as_the_in_process_backend_does(ray_session):
    # Two data-parallel ranks (each with half the rows, gradients all-reduced over gloo) against one
    # process with the whole batch: the same losses, and the same model afterwards.
    def kwargs(rank, dist):
        return {"role": "actor", "engine_name": "fake", "spec": SPEC, "dist": dist, "device": "cpu"}

    distributed = TrainRole("actor", RayGroup("actor", TrainWorker, kwargs, 2))
    local = TrainRole("actor", LocalGroup.train("actor", "fake", SPEC, device="cpu"))
    try:
        batch = numbered_batch(9)  # mini-batches of 3 rows: shards of 2 and 1 rows on the two ranks
        for seed in (1, 2):
            got = distributed.train(batch, token_nll_loss, mini_batch_size=3, epochs=2, shuffle_seed=seed)
            want = local.train(batch, token_nll_loss, mini_batch_size=3, epochs=2, shuffle_seed=seed)
            assert got["loss"] == pytest.approx(want["loss"], rel=1e-9)
            assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-9)
        probe = numbered_batch(7)
        torch.testing.assert_close(
            distributed.infer(probe)["log_probs"], local.infer(probe)["log_probs"], rtol=0, atol=1e-10
        )
    finally:
        distributed.shutdown()
        local.shutdown()


def test_balanced_shards_train_and_infer_as_consecutive_shards_do(ray_session):
    # Balancing moves rows between the DP ranks of one mini-batch. Losses are divided by the mini-batch's
    # global counts and gradients summed over ranks, so losses, gradient norms, a globally normalised
    # metric (nll) and the trained model must be those of consecutive shards; infer keeps row order.
    def kwargs(rank, dist):
        return {"role": "actor", "engine_name": "fake", "spec": SPEC, "dist": dist, "device": "cpu"}

    balanced = TrainRole("actor", RayGroup("actor", RecordingWorker, kwargs, 2))
    plain = TrainRole("actor", RayGroup("actor", RecordingWorker, kwargs, 2), balance_batch=False)
    try:
        batch = numbered_batch(12)  # mini-batches of 6 rows: shards of 3 rows, 2 micro-batches each
        for seed in (1, 2):
            got = balanced.train(batch, token_nll_loss, mini_batch_size=6, epochs=2, shuffle_seed=seed)
            want = plain.train(batch, token_nll_loss, mini_batch_size=6, epochs=2, shuffle_seed=seed)
            assert set(got) == set(want)
            for key, value in want.items():
                assert got[key] == pytest.approx(value, rel=1e-9), key
        seen = [balanced.group.call_all("recorded"), plain.group.call_all("recorded")]
        shards = [[rows for rank in role for rows, _ in rank] for role in seen]
        assert shards[0] != shards[1]  # balancing did move rows between ranks
        steps = [[sorted(a + b) for (a, _), (b, _) in zip(*role, strict=True)] for role in seen]
        assert steps[0] == steps[1]  # ... but never between mini-batches
        probe = numbered_batch(11)
        probe = probe.index(probe["attention_mask"].sum(1).argsort(descending=True))  # longest first
        assert balanced._shard_order(probe) is not None
        outputs = ("log_probs", "entropy")
        got, want = balanced.infer(probe, outputs), plain.infer(probe, outputs)
        for key in outputs:
            torch.testing.assert_close(got[key], want[key], rtol=0, atol=1e-10)
    finally:
        balanced.shutdown()
        plain.shutdown()


def test_a_rank_without_rows_still_joins_the_step(ray_session):
    # 9 rows in mini-batches of 4: the last mini-batch has one row, so rank 1 gets none. It must still
    # take part in the gradient and metric reductions (it used to reduce a shorter vector and hang).
    def kwargs(rank, dist):
        return {"role": "actor", "engine_name": "fake", "spec": SPEC, "dist": dist, "device": "cpu"}

    distributed = TrainRole("actor", RayGroup("actor", TrainWorker, kwargs, 2))
    local = TrainRole("actor", LocalGroup.train("actor", "fake", SPEC, device="cpu"))
    try:
        batch = numbered_batch(9)
        got = distributed.train(batch, token_nll_loss, mini_batch_size=4, epochs=1, shuffle_seed=None)
        want = local.train(batch, token_nll_loss, mini_batch_size=4, epochs=1, shuffle_seed=None)
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-9)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-9)
    finally:
        distributed.shutdown()
        local.shutdown()


def completions_batch(prompts, completions) -> tuple[Batch, torch.Tensor]:
    """Prompts (left-padded) and their first completions (right-padded) as a batch, and the rollout's
    log-probs ``[B, R]`` (0 on padding)."""
    responses = [c[0].token_ids for c in completions]
    p, r = max(map(len, prompts)), max(map(len, responses))
    rows = len(prompts)
    prompt_ids, response_ids = torch.zeros(rows, p, dtype=torch.long), torch.zeros(rows, r, dtype=torch.long)
    prompt_mask, response_mask = (
        torch.zeros(rows, p, dtype=torch.long),
        torch.zeros(rows, r, dtype=torch.long),
    )
    rollout_lp = torch.zeros(rows, r, dtype=torch.float64)
    for i, (prompt, c) in enumerate(zip(prompts, completions, strict=True)):
        prompt_ids[i, p - len(prompt) :], prompt_mask[i, p - len(prompt) :] = torch.tensor(prompt), 1
        n = len(c[0].token_ids)
        response_ids[i, :n], response_mask[i, :n] = torch.tensor(c[0].token_ids), 1
        rollout_lp[i, :n] = torch.tensor(c[0].log_probs, dtype=torch.float64)
    attention_mask = torch.cat([prompt_mask, response_mask], 1)
    tensors = {
        "prompts": prompt_ids,
        "responses": response_ids,
        "input_ids": torch.cat([prompt_ids, response_ids], 1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
        "response_mask": response_mask,
    }
    return Batch(tensors), rollout_lp


PROMPTS = [[5, 17, 9], [3], [250, 1, 2, 3, 4], [77, 78]]
PARAMS = SamplingParams(n=1, temperature=1.0, max_tokens=6, seed=11)


def logprob_gap(actor, rollout) -> float:
    completions = rollout.generate(PROMPTS, PARAMS)
    batch, rollout_lp = completions_batch(PROMPTS, completions)
    trainer_lp = actor.infer(batch)["log_probs"].to(torch.float64)
    return float((trainer_lp - rollout_lp).abs().max())


@pytest.mark.parametrize("transport", ["ray", "broadcast"])
def test_sync_weights_makes_rollout_log_probs_match_the_trainer(ray_actor, ray_rollout, transport):
    # A fresh step makes the trainer differ from the rollout's current weights.
    ray_actor.train(numbered_batch(6), token_nll_loss)
    assert logprob_gap(ray_actor, ray_rollout) > 1e-3
    metrics = sync_weights(
        ray_actor, ray_rollout, TransportConfig(name=transport, bucket_bytes=4096), "float64"
    )
    assert logprob_gap(ray_actor, ray_rollout) < 1e-10
    assert metrics["sync/bytes"] > 4096 and metrics["sync/buckets"] > 1  # several buckets travelled
    assert metrics["sync/seconds"] > 0 and "sync/load_seconds" in metrics


def test_release_and_resume_reach_the_engines(ray_actor):
    probe = numbered_batch(4)
    before = ray_actor.infer(probe)["log_probs"]
    ray_actor.release(("weights",))
    with pytest.raises(
        WorkerError,
        match=r"actor rank \d \(engine 'fake' from plugin 'rlcore.testing.plugin'.*\) failed in infer: RuntimeError: .*released",
    ):
        ray_actor.infer(probe)
    ray_actor.resume(("weights",))
    assert torch.equal(ray_actor.infer(probe)["log_probs"], before)


def test_generate_splits_prompts_over_engines_and_keeps_their_order(ray_rollout):
    prompts = [[i + 1, i + 2] for i in range(5)]
    out = ray_rollout.generate(prompts, SamplingParams(n=2, max_tokens=3))
    assert [[c.prompt_ids for c in group] for group in out] == [[p, p] for p in prompts]
    assert ray_rollout.num_engines == 2


class EmptyRefused:
    """Wraps a replica's engine to refuse an empty request list, as SGLang's does, and count calls."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def generate(self, prompts, params):
        if not prompts:
            raise ValueError("input_ids cannot be empty.")
        self.calls.append(len(prompts))
        return self.engine.generate(prompts, params)


@pytest.mark.parametrize("count", [1, 3, 4, 9])
def test_fewer_prompts_than_replicas_leave_the_others_out_and_spread_evenly(count):
    """Four replicas: 1 or 3 prompts go one to a replica and the rest are not called (no empty request
    list reaches an engine); 9 prompts go 3, 2, 2, 2, never one replica with two shares."""
    rollout = RolloutRole(LocalGroup.rollout("fake", ROLLOUT_SPEC, num_engines=4, device="cpu"))
    engines = []
    for worker in rollout.group.workers:
        worker.engine = EmptyRefused(worker.engine)
        engines.append(worker.engine)
    prompts = [[i + 1, i + 2, i + 3] for i in range(count)]
    out = rollout.generate(prompts, SamplingParams(n=2, max_tokens=3))
    assert [[c.prompt_ids for c in group] for group in out] == [[p, p] for p in prompts]
    calls = [sum(e.calls) for e in engines]
    assert sum(calls) == count and max(calls) - min(calls) <= 1
    assert all(len(e.calls) == (1 if n else 0) for e, n in zip(engines, calls, strict=True))


def test_in_process_backend_syncs_in_process():
    actor = TrainRole("actor", LocalGroup.train("actor", "fake", SPEC, device="cpu"))
    rollout = RolloutRole(LocalGroup.rollout("fake", ROLLOUT_SPEC, device="cpu"))
    assert resolve_transport_name("auto", actor, rollout) == "inprocess"
    actor.train(numbered_batch(6), token_nll_loss)
    assert logprob_gap(actor, rollout) > 1e-3
    sync_weights(actor, rollout, TransportConfig(name="auto"), "float64")
    assert logprob_gap(actor, rollout) < 1e-10
    with pytest.raises(ValueError, match="with trainer.backend=local use transport.name=inprocess"):
        sync_weights(actor, rollout, TransportConfig(name="broadcast"), "float64")


def test_train_refuses_batches_it_cannot_normalise():
    actor = TrainRole("actor", LocalGroup.train("actor", "fake", SPEC, device="cpu"))
    batch = numbered_batch(4)
    with pytest.raises(KeyError, match=r"actor.train needs batch\['response_mask'\]"):
        actor.train(Batch({"input_ids": batch["input_ids"]}), token_nll_loss)
    with pytest.raises(ValueError, match="mini_batch_size and epochs must be >= 1"):
        actor.train(batch, token_nll_loss, mini_batch_size=0)


class RecordingGroup:
    """A group that records the calls it gets; ``answers`` maps a method to what each rank returns."""

    def __init__(self, world_size, answers):
        self.world_size, self.answers, self.calls = world_size, answers, []

    def ping(self):
        return [{"node_ip": "10.0.0.7"}] * self.world_size

    def call_rank(self, rank, method, *args):
        self.calls.append((method, rank, args))
        return self.answers[method][rank]

    def call_all(self, method, *args):
        return [self.call_rank(rank, method, *args) for rank in range(self.world_size)]

    def call_all_async(self, method, *args):
        from rlcore.cluster.dispatch import Pending

        self.calls.append((method, "all", args))
        return Pending(lambda: [None] * self.world_size)


def test_weight_group_ranks_follow_the_engines_devices():
    from rlcore.cluster.roles import _join_weight_group

    actor = SimpleNamespace(group=RecordingGroup(2, {"free_port": [29500, 29501]}))
    # engine 0 receives on 2 devices (tensor parallel), engine 1 on 1: group ranks 0 | 1 2 | 3
    rollout = SimpleNamespace(group=RecordingGroup(2, {"weight_group_ranks": [2, 1]}), _joined=set())
    _join_weight_group(actor, rollout, "sglang-distributed", "config", sender=1)
    assert (
        "join_weight_group",
        "all",
        ("sglang-distributed", "config", 1, 4, "10.0.0.7", 29501),
    ) in actor.group.calls
    assert rollout.group.calls[-1] == (
        "join_weight_group",
        "all",
        ("sglang-distributed", "config", 4, "10.0.0.7", 29501, [1, 3]),
    )
    _join_weight_group(actor, rollout, "sglang-distributed", "config", sender=1)  # joined once
    assert sum(call[0] == "join_weight_group" for call in rollout.group.calls) == 1


def test_image_prompts_for_an_agent_program_are_refused_by_name():
    """The chat endpoint an agent program talks to takes text messages: image prompts stop before any
    replica is called, with what to use instead."""

    class NoGroup:
        def dispatch(self, *args, **kwargs):
            raise AssertionError("no replica may be called")

    role = RolloutRole(NoGroup())
    with pytest.raises(ValueError, match=r"agent.program/agent.command: .* use the built-in tool loop"):
        role.run_episodes(
            [[1, 2]],
            SamplingParams(),
            SimpleNamespace(uses_program=True),
            "tokenizer",
            rows=[{}],
            multi_modal=[{"image": []}],
        )

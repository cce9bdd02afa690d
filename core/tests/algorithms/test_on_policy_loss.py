"""The on-policy shortcut of ``ActorLoss``: a batch without ``old_log_probs`` takes the forward's own
detached log-probs. In float64 it gives the loss and gradients of the path that first recomputes the old
log-probs with a separate forward, and of the policy-gradient formula the PPO objective reduces to at
ratio 1, with micro-batches summed into one optimizer step as the engines do."""

import math

import pytest
import torch
from rlcore import algorithms
from rlcore.algorithms import ActorLoss
from rlcore.api import Batch, EngineSpec
from rlcore.testing.fake_config import FakeTrainConfig
from rlcore.testing.fake_train import FakeTrainEngine
from rlcore.testing.tiny_lm import TinyLM, token_log_probs

VOCAB, PROMPT, RESPONSE, ROWS, MICRO = 32, 3, 5, 8, 3


def rollout_batch(seed: int = 0) -> Batch:
    """Prompts and right-padded responses (every response at least one token) in the standard layout,
    with advantages and reference log-probs, float64."""
    g = torch.Generator().manual_seed(seed)
    responses = torch.randint(0, VOCAB, (ROWS, RESPONSE), generator=g)
    lengths = torch.randint(1, RESPONSE + 1, (ROWS,), generator=g)
    mask = (torch.arange(RESPONSE)[None] < lengths[:, None]).long()
    prompts = torch.randint(0, VOCAB, (ROWS, PROMPT), generator=g)
    return Batch(
        {
            "input_ids": torch.cat([prompts, responses * mask], 1),
            "attention_mask": torch.cat([torch.ones(ROWS, PROMPT, dtype=torch.long), mask], 1),
            "responses": responses * mask,
            "response_mask": mask,
            "advantages": torch.randn(ROWS, RESPONSE, generator=g, dtype=torch.float64) * mask,
            "ref_log_prob": (-3.5 + 0.3 * torch.randn(ROWS, RESPONSE, generator=g, dtype=torch.float64))
            * mask,
        }
    )


def forward(model: TinyLM, batch: Batch) -> dict[str, torch.Tensor]:
    """The fake engine's policy forward: log-prob and entropy of each response token, 0 at padding."""
    logits = model(batch["input_ids"], batch["attention_mask"])[:, -RESPONSE - 1 : -1]
    log_probs, entropy = token_log_probs(logits, batch["responses"])
    mask = batch["response_mask"].to(log_probs.dtype)
    return {"log_probs": log_probs * mask, "entropy": entropy * mask}


def one_step(model: TinyLM, batch: Batch, loss_fn: ActorLoss) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Summed micro-batch losses normalised by the whole batch's counts, and the accumulated gradients."""
    model.zero_grad(set_to_none=True)
    counts = algorithms.global_batch_counts(batch["response_mask"])
    total = torch.zeros((), dtype=torch.float64)
    for micro in batch.split(MICRO):
        micro.meta.update(counts)
        loss, _ = loss_fn(forward(model, micro), micro)
        loss.backward()
        total = total + loss.detach()
    return total, [p.grad.clone() for p in model.parameters()]


def recomputed(model: TinyLM, batch: Batch) -> Batch:
    """``batch`` with ``old_log_probs`` from a separate no-grad forward over the whole batch (the pass)."""
    with torch.no_grad():
        old = forward(model, batch)["log_probs"]
    return Batch({**batch.tensors, "old_log_probs": old})


LOSSES = [
    ("vanilla", {}),
    ("gspo", {}),
    ("cispo", {}),
    ("geo_mean", {}),
    ("gpg", {}),
    ("kl_cov", {"kl_cov_ratio": 0.2}),
]


@pytest.mark.parametrize(("policy_loss", "kwargs"), LOSSES, ids=[name for name, _ in LOSSES])
@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_the_shortcut_gives_the_recompute_paths_loss_and_gradients(policy_loss, kwargs, loss_agg_mode):
    model = TinyLM(VOCAB, 16, seed=3, dtype=torch.float64)
    batch = rollout_batch()
    loss_fn = ActorLoss(
        policy_loss=policy_loss,
        loss_agg_mode=loss_agg_mode,
        entropy_coeff=0.01,
        use_kl_loss=True,
        kl_loss_coef=0.1,
        policy_loss_kwargs=kwargs,
    )
    loss_recompute, grads_recompute = one_step(model, recomputed(model, batch), loss_fn)
    loss_shortcut, grads_shortcut = one_step(model, batch, loss_fn)
    torch.testing.assert_close(loss_shortcut, loss_recompute, rtol=1e-12, atol=1e-14)
    for shortcut, recompute in zip(grads_shortcut, grads_recompute, strict=True):
        assert shortcut.abs().max() > 0
        torch.testing.assert_close(shortcut, recompute, rtol=1e-11, atol=1e-14)


def test_the_shortcut_is_the_policy_gradient_at_ratio_one():
    """At ratio 1 PPO's clipped objective is ``-A`` per token and its gradient ``-A grad log pi``: the
    shortcut's loss and gradients against that formula written out here, with the entropy and (k2) KL terms."""
    model = TinyLM(VOCAB, 16, seed=5, dtype=torch.float64)
    batch = rollout_batch(seed=1)
    ent_coef, kl_coef = 0.01, 0.1
    loss_fn = ActorLoss(entropy_coeff=ent_coef, use_kl_loss=True, kl_loss_type="mse", kl_loss_coef=kl_coef)
    loss, grads = one_step(model, batch, loss_fn)

    model.zero_grad(set_to_none=True)
    out = forward(model, batch)
    lp, ent = out["log_probs"], out["entropy"]
    m, adv, ref = batch["response_mask"].double(), batch["advantages"], batch["ref_log_prob"]
    n_tokens = m.sum()
    d = lp - ref
    k2 = d**2 / 2
    surrogate = (-(adv * lp * m).sum() - ent_coef * (ent * m).sum() + kl_coef * (k2 * m).sum()) / n_tokens
    value = (-(adv * m).sum() - ent_coef * (ent * m).sum() + kl_coef * (k2 * m).sum()) / n_tokens
    surrogate.backward()
    torch.testing.assert_close(loss, value.detach(), rtol=1e-12, atol=1e-14)
    for got, want in zip(grads, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-14)


def fake_engine() -> FakeTrainEngine:
    spec = EngineSpec(model_path="", dtype="float64", micro_batch_size=MICRO, lr=1e-2, seed=7)
    return FakeTrainEngine(spec, FakeTrainConfig(vocab_size=VOCAB, hidden_size=16))


def test_a_fake_engine_step_matches_with_and_without_the_pass():
    """The engines' calling convention: one ``train_step`` over micro-batches, after ``infer`` (the pass)
    on one engine and without it on an identical one: the same loss, gradient norm and new weights. The
    shortcut reports the rollout-vs-trainer gap from its own forward and an exact ratio of 1."""
    batch = rollout_batch(seed=2)
    batch.meta.update(algorithms.global_batch_counts(batch["response_mask"]))
    loss_fn = ActorLoss(entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1)
    with_pass, without = fake_engine(), fake_engine()

    old = with_pass.infer(batch, ("log_probs",))["log_probs"]
    recompute = Batch({**batch.tensors, "old_log_probs": old}, meta=dict(batch.meta))
    metrics_recompute = with_pass.train_step(recompute, loss_fn)
    gap = 0.25 * batch["response_mask"]
    shortcut = Batch({**batch.tensors, "rollout_log_probs": old + gap}, meta=dict(batch.meta))
    metrics_shortcut = without.train_step(shortcut, loss_fn)

    for key in ("loss", "grad_norm", "actor/pg_loss", "actor/entropy", "actor/kl_loss"):
        assert metrics_shortcut[key] == pytest.approx(metrics_recompute[key], rel=1e-12, abs=1e-14), key
    for a, b in zip(with_pass.model.parameters(), without.model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)
    assert metrics_shortcut["actor/ppo_kl"] == 0.0 and metrics_shortcut["actor/pg_clipfrac"] == 0.0
    assert metrics_shortcut["rollout/logprob_diff_mean"] == pytest.approx(0.25, rel=1e-6)
    # The rollout found every token e^0.25 times likelier than the trainer: r = e^-0.25 throughout.
    assert metrics_shortcut["rollout/mismatch_k3_kl"] == pytest.approx(math.exp(-0.25) - 1 + 0.25, rel=1e-6)
    assert metrics_shortcut["rollout/mismatch_ppl_ratio"] == pytest.approx(math.exp(0.25), rel=1e-6)
    assert not any(k.startswith("rollout/logprob_diff_p") for k in metrics_shortcut)  # not averageable
    assert "rollout/logprob_diff_mean" not in metrics_recompute  # the pass reports it, not the loss

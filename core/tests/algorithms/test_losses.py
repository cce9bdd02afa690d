"""ActorLoss / CriticLoss: the engine-facing loss objects, their global normalisation and their errors."""

import math
import pickle

import pytest
import torch
from rlcore import algorithms
from rlcore.algorithms import ActorLoss, CriticLoss, get_preset
from rlcore.api import Batch
from rlcore.plugins.registries import RegistryError


def make_batch(seed=0, batch=8, length=6):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=g, dtype=torch.float64) * 2
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    lengths[3] = 0
    mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).long()
    fields = {
        "old_log_probs": old,
        "advantages": torch.randn(batch, length, generator=g, dtype=torch.float64),
        "response_mask": mask,
        "ref_log_prob": old + torch.randn(batch, length, generator=g, dtype=torch.float64) * 0.3,
        "returns": torch.randn(batch, length, generator=g, dtype=torch.float64),
        "values": torch.randn(batch, length, generator=g, dtype=torch.float64),
    }
    log_probs = (old + torch.randn(batch, length, generator=g, dtype=torch.float64) * 0.3).requires_grad_()
    entropy = (torch.rand(batch, length, generator=g, dtype=torch.float64) * 2).requires_grad_()
    return Batch(fields), log_probs, entropy


def shards(batch, ranks=2, micro=2):
    """Data-parallel shards, each cut into micro-batches: ``[(rows, micro_batch), ...]``."""
    out, start = [], 0
    for shard in batch.chunk(ranks):
        for mb in shard.split(micro):
            rows = slice(start, start + len(mb))
            start += len(mb)
            out.append((rows, mb))
    return out


def reference_actor_loss(batch, lp, ent, clip=0.2, entropy_coeff=0.01, kl_coef=0.05):
    """Whole-batch token-mean PPO loss - entropy bonus + k3 KL, as one loop over valid tokens."""
    terms = []
    for i in range(lp.shape[0]):
        for t in range(lp.shape[1]):
            if not batch["response_mask"][i, t]:
                continue
            a = float(batch["advantages"][i, t])
            r = torch.exp(lp[i, t] - float(batch["old_log_probs"][i, t]))
            pg = torch.maximum(-a * r, -a * torch.clamp(r, 1 - clip, 1 + clip))
            if a < 0:
                pg = torch.minimum(pg, torch.tensor(-a * 3.0, dtype=pg.dtype))
            d = lp[i, t] - float(batch["ref_log_prob"][i, t])
            k3 = torch.exp(-d) + d - 1
            terms.append(pg - entropy_coeff * ent[i, t] + kl_coef * k3)
    return sum(terms) / len(terms)


def test_micro_batch_losses_sum_to_the_whole_batch_token_mean():
    batch, lp, ent = make_batch()
    loss_fn = ActorLoss(entropy_coeff=0.01, use_kl_loss=True, kl_loss_type="low_var_kl", kl_loss_coef=0.05)
    reference = reference_actor_loss(batch, lp, ent)
    whole, _ = loss_fn({"log_probs": lp, "entropy": ent}, batch)
    torch.testing.assert_close(whole, reference)

    counts = algorithms.global_batch_counts(batch["response_mask"])
    total = 0.0
    for rows, mb in shards(batch):
        mb.meta.update(counts)
        part, metrics = loss_fn({"log_probs": lp[rows], "entropy": ent[rows]}, mb)
        total = total + part
        assert all(isinstance(v, float) for v in metrics.values())
    torch.testing.assert_close(total, reference)
    for leaf in (lp, ent):
        torch.testing.assert_close(
            torch.autograd.grad(total, leaf, retain_graph=True)[0],
            torch.autograd.grad(reference, leaf, retain_graph=True)[0],
        )


@pytest.mark.parametrize("mode", algorithms.LOSS_AGG_MODES)
@pytest.mark.parametrize("policy_loss", ["vanilla", "gspo", "cispo", "gpg"])
def test_micro_batch_sum_equals_whole_batch_for_every_mode(mode, policy_loss):
    batch, lp, ent = make_batch(seed=1, batch=10)
    loss_fn = ActorLoss(
        policy_loss=policy_loss,
        loss_agg_mode=mode,
        entropy_coeff=0.02,
        use_kl_loss=True,
        kl_loss_type="k3+",
        loss_scale_factor=6,
    )
    whole, _ = loss_fn({"log_probs": lp, "entropy": ent}, batch)
    counts = algorithms.global_batch_counts(batch["response_mask"])
    total = 0.0
    for rows, mb in shards(batch, ranks=3, micro=2):
        mb.meta.update(counts)
        total = total + loss_fn({"log_probs": lp[rows], "entropy": ent[rows]}, mb)[0]
    torch.testing.assert_close(total, whole, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        torch.autograd.grad(total, lp, retain_graph=True)[0],
        torch.autograd.grad(whole, lp)[0],
        rtol=1e-12,
        atol=1e-12,
    )


def test_metrics_are_micro_batch_means_not_shares():
    batch, lp, ent = make_batch(seed=2)
    loss_fn = ActorLoss(use_kl_loss=True)
    mb = batch.index(slice(0, 3))
    alone, alone_metrics = loss_fn({"log_probs": lp[:3], "entropy": ent[:3]}, mb)
    mb.meta.update(algorithms.global_batch_counts(batch["response_mask"]))
    share, metrics = loss_fn({"log_probs": lp[:3], "entropy": ent[:3]}, mb)
    assert share.item() != pytest.approx(alone.item())
    assert metrics == pytest.approx(alone_metrics)
    assert metrics["actor/pg_loss"] == pytest.approx(alone.item() - 0.001 * metrics["actor/kl_loss"])
    assert metrics["actor/entropy"] == pytest.approx(
        float((ent[:3].detach() * mb["response_mask"]).sum() / mb["response_mask"].sum())
    )


def test_actor_loss_pickles_and_from_preset():
    dapo = ActorLoss.from_preset(get_preset("dapo"))
    assert (dapo.clip_ratio_low, dapo.clip_ratio_high, dapo.clip_ratio_c) == (0.2, 0.28, 10.0)
    assert dapo.loss_agg_mode == "token-mean" and not dapo.use_kl_loss
    grpo = ActorLoss.from_preset(get_preset("grpo"), entropy_coeff=0.001)
    assert grpo.use_kl_loss and grpo.kl_loss_type == "low_var_kl" and grpo.entropy_coeff == 0.001
    gspo = ActorLoss.from_preset(get_preset("gspo"))
    assert gspo.policy_loss == "gspo" and gspo.loss_agg_mode == "seq-mean-token-mean"
    clone = pickle.loads(pickle.dumps(grpo))
    assert clone == grpo
    batch, lp, ent = make_batch(seed=3)
    a, _ = grpo({"log_probs": lp, "entropy": ent}, batch)
    b, _ = clone({"log_probs": lp, "entropy": ent}, batch)
    assert a.item() == b.item()


def test_policy_loss_kwargs_reach_the_loss_and_typos_fail():
    batch, lp, _ = make_batch(seed=4)
    kl_cov = ActorLoss(policy_loss="kl_cov", policy_loss_kwargs={"kl_cov_ratio": 0.5, "ppo_kl_coef": 2.0})
    loss, _ = kl_cov({"log_probs": lp}, batch)
    direct, _ = algorithms.get_policy_loss("kl_cov")(
        batch["old_log_probs"],
        lp,
        batch["advantages"],
        batch["response_mask"],
        kl_cov_ratio=0.5,
        ppo_kl_coef=2.0,
    )
    assert loss.item() == pytest.approx(direct.item())
    with pytest.raises(TypeError, match="'kl_cov_ration'"):
        ActorLoss(policy_loss="kl_cov", policy_loss_kwargs={"kl_cov_ration": 0.5})({"log_probs": lp}, batch)


def test_actor_loss_errors_name_what_is_missing():
    batch, lp, ent = make_batch(seed=5)
    with pytest.raises(RegistryError, match="vanilla"):
        ActorLoss(policy_loss="ppo_clip")
    with pytest.raises(ValueError, match="loss_agg_mode"):
        ActorLoss(loss_agg_mode="sum")
    with pytest.raises(ValueError, match="KL penalty"):
        ActorLoss(use_kl_loss=True, kl_loss_type="k5")
    no_ref = Batch({k: v for k, v in batch.tensors.items() if k != "ref_log_prob"})
    with pytest.raises(KeyError, match="ref_log_prob"):
        ActorLoss(use_kl_loss=True)({"log_probs": lp}, no_ref)
    with pytest.raises(KeyError, match="'log_probs'"):
        ActorLoss()({"logprobs": lp}, batch)
    with pytest.raises(KeyError, match="'entropy'"):
        ActorLoss(entropy_coeff=0.1)({"log_probs": lp}, batch)


def test_actor_loss_with_bf16_outputs():
    batch, lp, ent = make_batch(seed=6)
    low = lp.detach().bfloat16().requires_grad_()
    loss, _ = ActorLoss()({"log_probs": low}, batch)
    assert loss.dtype == torch.float64  # old_log_probs are float64 here: promoted, never rounded to bf16
    loss.backward()
    assert low.grad.dtype == torch.bfloat16 and torch.isfinite(low.grad).all()
    all_bf16 = Batch({k: (v.bfloat16() if v.is_floating_point() else v) for k, v in batch.tensors.items()})
    loss, _ = ActorLoss(use_kl_loss=True)({"log_probs": low}, all_bf16)
    assert loss.dtype == torch.float32


def test_critic_loss_sums_over_micro_batches():
    batch, _, _ = make_batch(seed=7)
    vpreds = torch.randn(batch["values"].shape, dtype=torch.float64).requires_grad_()
    loss_fn = CriticLoss(cliprange_value=0.3)
    whole, _ = loss_fn({"values": vpreds}, batch)
    # Reference: 0.5 * mean over valid tokens of the larger squared error.
    terms = []
    for i in range(vpreds.shape[0]):
        for t in range(vpreds.shape[1]):
            if batch["response_mask"][i, t]:
                v, v_old, ret = vpreds[i, t], float(batch["values"][i, t]), float(batch["returns"][i, t])
                clipped = torch.clamp(v, v_old - 0.3, v_old + 0.3)
                terms.append(torch.maximum((v - ret) ** 2, (clipped - ret) ** 2))
    reference = 0.5 * sum(terms) / len(terms)
    torch.testing.assert_close(whole, reference)
    counts = algorithms.global_batch_counts(batch["response_mask"])
    total = 0.0
    for rows, mb in shards(batch):
        mb.meta.update(counts)
        total = total + loss_fn({"values": vpreds[rows]}, mb)[0]
    torch.testing.assert_close(total, reference)
    torch.testing.assert_close(
        torch.autograd.grad(total, vpreds, retain_graph=True)[0], torch.autograd.grad(reference, vpreds)[0]
    )
    preset_loss = CriticLoss.from_preset(get_preset("ppo"))
    assert preset_loss.cliprange_value == 0.5 and pickle.loads(pickle.dumps(preset_loss)) == preset_loss
    with pytest.raises(KeyError, match="'returns'"):
        loss_fn(
            {"values": vpreds}, Batch({"values": batch["values"], "response_mask": batch["response_mask"]})
        )


def test_empty_micro_batch_contributes_zero():
    batch, lp, ent = make_batch(seed=8)
    rows = (batch["response_mask"].sum(-1) == 0).nonzero().flatten().tolist()
    mb = batch.index(rows)
    mb.meta.update(algorithms.global_batch_counts(batch["response_mask"]))
    loss, metrics = ActorLoss(entropy_coeff=0.1, use_kl_loss=True)(
        {"log_probs": lp[rows], "entropy": ent[rows]}, mb
    )
    assert loss.item() == 0.0 and all(math.isfinite(v) for v in metrics.values())

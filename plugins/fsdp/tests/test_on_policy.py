"""The on-policy shortcut on the real engine (CPU, float64): ``train_step`` with a batch whose
``old_log_probs`` come from ``infer`` (the pass) and one without them (the actor loss takes the training
forward's detached log-probs) give the same loss, gradient norm and weights, in the padded and the packed
layout, with micro-batches and a temperature other than 1."""

import pytest
import torch
from fsdp_support import batch, full_weights, spec
from rlcore.algorithms import ActorLoss
from rlcore.api import Batch, DistInfo
from rlcore.devices import get_platform
from rlcore_fsdp.config import FSDPConfig
from rlcore_fsdp.engine import FSDPEngine


def make(model_path, config: FSDPConfig) -> FSDPEngine:
    # micro_batch_size 3 over 7 rows: three micro-batches accumulate into the one optimizer step.
    return FSDPEngine(spec(str(model_path), dtype="float64"), config, get_platform("cpu"), DistInfo())


@pytest.mark.parametrize(
    "config",
    [FSDPConfig(), FSDPConfig(use_remove_padding=True, recompute_logits=False)],
    ids=["padded", "packed"],
)
def test_one_step_is_the_same_with_and_without_the_old_log_prob_pass(tiny_model_path, config):
    data = batch()
    data.tensors["advantages"] = torch.randn(
        data["response_mask"].shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64
    )
    loss_fn = ActorLoss(entropy_coeff=0.01)
    with_pass, without = make(tiny_model_path, config), make(tiny_model_path, config)

    old = with_pass.infer(data, ["log_probs"])["log_probs"]
    recompute = with_pass.train_step(Batch({**data.tensors, "old_log_probs": old}, meta=data.meta), loss_fn)
    shortcut = without.train_step(data, loss_fn)

    for key in ("loss", "grad_norm", "actor/pg_loss", "actor/entropy"):
        assert shortcut[key] == pytest.approx(recompute[key], rel=1e-10, abs=1e-13), key
    assert shortcut["actor/ppo_kl"] == 0.0
    expected = full_weights(with_pass)
    for name, tensor in full_weights(without).items():
        torch.testing.assert_close(tensor, expected[name], rtol=1e-10, atol=1e-13)

"""Ulysses sequence parallelism (``fsdp.sequence_parallel_size``, :mod:`rlcore_fsdp.sequence_parallel`).

One spawn of two gloo ranks forming one sequence-parallel group (``fsdp_sp_worker.py``) checks the q/k/v
exchange and the result gather with their backwards against plain tensor references, the attention on
slices against the attention on the whole row, and lm, value and score engines against the same engines
on one process without sequence parallelism, fed the same batch. The slicing of packed inputs and the
refusals are checked in this process.
"""

from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp
from fsdp_sp_worker import ATTENTION_BOUNDS, ATTENTION_HEADS, SP, attention_inputs, run
from fsdp_support import STEPS, batch, free_port, full_weights, nll_entropy_loss, spec
from rlcore.api import DistInfo
from rlcore.devices import get_platform
from rlcore.testing.contract import value_mse_loss
from rlcore_fsdp.attention import varlen_attention
from rlcore_fsdp.config import FSDPConfig
from rlcore_fsdp.engine import FSDPEngine
from rlcore_fsdp.micro_batches import build_inputs
from rlcore_fsdp.sequence_parallel import SequenceParallel, check_heads, shard_inputs


@pytest.fixture(scope="module")
def ranks(tiny_model_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp-sp")
    mp.spawn(run, args=(SP, free_port(), str(tiny_model_path), str(out)), nprocs=SP, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(SP)]


def make(model_path, **overrides) -> FSDPEngine:
    """The one-process reference: no sequence parallelism, padded micro-batches."""
    return FSDPEngine(spec(str(model_path), **overrides), FSDPConfig(), get_platform("cpu"), DistInfo())


def test_exchange_and_gather_match_plain_tensor_references(ranks):
    xs = [r["exchange"]["x"] for r in ranks]  # each [C, H, D]
    whole = torch.cat(xs)  # [SP*C, H, D]
    heads = whole.shape[1] // SP
    cotangent = torch.cat([r["exchange"]["cotangent"] for r in ranks], dim=1)  # [SP*C, H, D]
    for s, r in enumerate(ranks):
        assert torch.equal(r["exchange"]["y"], whole[:, s * heads : (s + 1) * heads])
        assert torch.equal(r["exchange"]["back"], xs[s])
        # The backward is the inverse exchange: rank s's tokens, every rank's head cotangents.
        assert torch.equal(r["exchange"]["grad"], cotangent[s * len(xs[s]) : (s + 1) * len(xs[s])])

    want = torch.zeros(6, dtype=torch.float64)
    for s, r in enumerate(ranks):
        want[s::SP] = r["gather"]["local"]
    weights = torch.arange(1.0, 7.0, dtype=torch.float64)
    for s, r in enumerate(ranks):
        assert torch.equal(r["gather"]["gathered"], want)
        assert torch.equal(r["gather"]["grad"], weights[s::SP]), "each rank gets its own entries' gradient"


@pytest.mark.parametrize("heads", ATTENTION_HEADS)
def test_attention_on_slices_equals_attention_on_the_whole_row(ranks, heads):
    q, k, v, cotangent = attention_inputs(*heads)
    leaves = [t[0].transpose(0, 1).clone().requires_grad_() for t in (q, k, v)]  # [N, H, D]
    bounds = torch.tensor(ATTENTION_BOUNDS, dtype=torch.int32)
    want = varlen_attention(*leaves, bounds, 7, 0.3)  # [N, H, D]
    want_grads = torch.autograd.grad(want, leaves, cotangent[0])
    got = torch.cat([r["attention"][heads]["out"][0] for r in ranks])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    for i, want_grad in enumerate(want_grads):  # [N, H, D] against the ranks' [1, H, C, D]
        got_grad = torch.cat([r["attention"][heads]["grads"][i][0] for r in ranks], dim=1)
        torch.testing.assert_close(got_grad.transpose(0, 1), want_grad, rtol=0, atol=1e-12)


def test_lm_training_and_log_probs_equal_one_process(ranks, tiny_model_path):
    assert [r["dp"] for r in ranks] == [((0, 1), True), ((0, 1), False)], "one data-parallel rank"
    assert ranks[1]["lm_infer"] is None and ranks[1]["values"] is None and ranks[1]["scores"] is None
    data = batch()
    reference = make(tiny_model_path, dtype="float64")
    metrics = [reference.train_step(data, nll_entropy_loss) for _ in range(STEPS)]
    for step in range(STEPS):
        got, want = ranks[0]["lm_metrics"][step], metrics[step]
        assert ranks[1]["lm_metrics"][step] == got, "metrics must be identical on every rank"
        assert set(got) == set(want)
        # A loss counted once per rank of the group, or gradients not summed once per token, are off by 2x.
        assert got["loss"] == pytest.approx(want["loss"], rel=0, abs=1e-9)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-9)
    for name, tensor in full_weights(reference).items():
        torch.testing.assert_close(ranks[0]["lm_weights"][name], tensor, rtol=0, atol=1e-9, msg=name)
    want = reference.infer(data, ["log_probs", "entropy"])
    for field in ("log_probs", "entropy"):
        torch.testing.assert_close(ranks[0]["lm_infer"][field], want[field], rtol=0, atol=1e-9, msg=field)


def test_value_and_score_heads_equal_one_process(ranks, tiny_model_path):
    data = batch()
    critic = make(tiny_model_path, head="value", dtype="float64")
    values = critic.infer(data, ["values"])["values"]
    metrics = critic.train_step(data, value_mse_loss)
    weights = full_weights(critic)
    reward = make(tiny_model_path, head="score")
    scores = reward.infer(data, ["scores"])["scores"]
    torch.testing.assert_close(ranks[0]["values"]["values"], values, rtol=0, atol=1e-9)
    # float32: each row's last token lands in the right place whichever rank's slice holds it.
    torch.testing.assert_close(ranks[0]["scores"]["scores"], scores, rtol=0, atol=1e-5)
    for r in ranks:
        assert r["value_metrics"]["loss"] == pytest.approx(metrics["loss"], rel=0, abs=1e-9)
        assert r["value_metrics"]["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-9)
    for name, tensor in ranks[0]["value_weights"].items():
        torch.testing.assert_close(tensor, weights[name], rtol=0, atol=1e-9, msg=name)


@pytest.mark.parametrize("size", [2, 3])
def test_shard_inputs_splits_the_padded_row_and_its_head_positions(size):
    inputs = build_inputs(batch().index([0, 1, 2, 4]), "lm", packed=True, anchor=True)
    n, total = inputs.input_ids.shape[1], len(inputs.index) - 1  # the last position is the anchor
    padded = n + (-n % size)
    shards = [shard_inputs(inputs, SequenceParallel(None, s, size), anchor=True) for s in range(size)]
    ids = torch.cat([local.input_ids for local, _, _ in shards], 1)
    positions = torch.cat([local.position_ids for local, _, _ in shards], 1)
    assert torch.equal(ids[:, :n], inputs.input_ids) and torch.equal(positions[:, :n], inputs.position_ids)
    assert positions[0, n:].tolist() == list(range(padded - n)), "the padding is a sequence of its own"
    chunk = padded // size
    seen = []
    for s, (local, slots, count) in enumerate(shards):
        assert count == total and local.input_ids.shape == (1, chunk)
        assert local.cu_seq_lens.tolist() == inputs.cu_seq_lens.tolist() + ([padded] if padded > n else [])
        assert local.max_length == max(inputs.max_length, padded - n)
        # Head positions of the slice, with the targets paired on the whole row; then the local anchor.
        assert torch.equal(local.index[:-1] + s * chunk, inputs.index[slots])
        assert torch.equal(local.targets[:-1], inputs.targets[slots])
        assert ((local.index[:-1] >= 0) & (local.index[:-1] < chunk)).all()
        assert local.index[-1] == 0 and local.targets[-1] == local.input_ids[0, 0]
        seen += slots.tolist()
    assert sorted(seen) == list(range(total)), "every head position is read on exactly one rank"


def test_refusals_name_the_keys(tiny_model_path):
    with pytest.raises(ValueError, match="fsdp.sequence_parallel_size must be >= 1"):
        FSDPConfig(sequence_parallel_size=0)
    with pytest.raises(ValueError, match="use_remove_padding=true and fsdp.attn_implementation=varlen"):
        make_sp = FSDPConfig(sequence_parallel_size=2, use_remove_padding=True)
        FSDPEngine(spec(str(tiny_model_path)), make_sp, get_platform("cpu"), DistInfo(world_size=2))
    with pytest.raises(ValueError, match=r"sequence_parallel_size=2 must divide the role's world size \(3\)"):
        config = FSDPConfig(sequence_parallel_size=2, use_remove_padding=True, attn_implementation="varlen")
        FSDPEngine(spec(str(tiny_model_path)), config, get_platform("cpu"), DistInfo(world_size=3))
    check_heads(SimpleNamespace(num_attention_heads=4, num_key_value_heads=2), 2)
    check_heads(SimpleNamespace(num_attention_heads=4, num_key_value_heads=2), 4)  # key/value heads repeated
    for size in (3, 8):
        with pytest.raises(ValueError, match=rf"size={size} .*num_attention_heads=4.*num_key_value_heads=2"):
            check_heads(SimpleNamespace(num_attention_heads=4, num_key_value_heads=2), size)

"""TinyLM and the shared log-prob maths, against hand-worked values and a float64 loop reference."""

import json
import math

import pytest
import torch
from rlcore.testing.numerics import reduction_atol
from rlcore.testing.tiny_lm import TinyLM, resolve_vocab_size, token_log_probs


@pytest.mark.parametrize("head", ["lm", "value"])
@pytest.mark.parametrize("prev_token", [True, False])
def test_forward_matches_float64_loop(head, prev_token, ref_outputs):
    model = TinyLM(40, 8, head=head, prev_token=prev_token, seed=3)
    ids = [5, 17, 17, 0, 39, 2]
    got = model(torch.tensor([ids]))[0].double()
    want = torch.tensor(ref_outputs(model, ids), dtype=torch.float64)
    torch.testing.assert_close(got, want.squeeze(-1) if head == "value" else want, rtol=1e-5, atol=1e-5)


def test_float64_model_matches_loop_to_rounding(ref_outputs):
    model = TinyLM(40, 8, seed=1, dtype=torch.float64)
    ids = [1, 2, 3, 4]
    torch.testing.assert_close(
        model(torch.tensor([ids]))[0],
        torch.tensor(ref_outputs(model, ids), dtype=torch.float64),
        rtol=1e-12,
        atol=1e-12,
    )


def test_left_padding_is_invisible():
    model = TinyLM(40, 8, seed=0)
    ids = [7, 8, 9]
    alone = model(torch.tensor([ids]))[0]
    padded = model(torch.tensor([[0, 0, *ids]]), torch.tensor([[0, 0, 1, 1, 1]]))[0, 2:]
    # Same sums with padded rows beside them: equal to fp32 rounding along the width-8 model's
    # reductions (previous-token mix 8, MLP 8 + 16, head 8).
    atol = reduction_atol(torch.float32, n=5 * 8, scale=alone.abs().max().item())
    torch.testing.assert_close(padded, alone, rtol=0, atol=atol)
    # Without the mask the first real token sees the pad: the mask is what makes this work.
    unmasked = model(torch.tensor([[0, 0, *ids]]))[0, 2:]
    assert not torch.allclose(unmasked[0], alone[0])


def test_same_seed_same_weights_and_shared_trunk():
    a, b = TinyLM(30, 6, seed=4), TinyLM(30, 6, seed=4)
    torch.manual_seed(123)  # the global RNG plays no part
    c = TinyLM(30, 6, seed=4)
    value = TinyLM(30, 6, seed=4, head="value")
    for (name, pa), (_, pb), (_, pc) in zip(
        a.named_parameters(), b.named_parameters(), c.named_parameters(), strict=True
    ):
        assert torch.equal(pa, pb) and torch.equal(pa, pc), name
    trunk = {n: p for n, p in a.named_parameters() if n.startswith("model.")}
    for name, p in value.named_parameters():
        if name.startswith("model."):
            assert torch.equal(p, trunk[name]), name
    assert not torch.equal(TinyLM(30, 6, seed=5).lm_head.weight, a.lm_head.weight)
    assert {n for n, _ in a.named_parameters()} == {
        "model.embed_tokens.weight",
        "model.prev_proj.weight",
        "model.mlp.up_proj.weight",
        "model.mlp.down_proj.weight",
        "lm_head.weight",
    }


def test_out_of_vocabulary_ids_are_a_clear_error():
    with pytest.raises(ValueError, match=r"\[0, 10\).*vocab_size"):
        TinyLM(10, 4)(torch.tensor([[3, 10]]))
    with pytest.raises(ValueError, match="head must be one of"):
        TinyLM(10, 4, head="policy")


def test_token_log_probs_hand_worked():
    # p = softmax([0, ln 3]) = [1/4, 3/4]
    logits = torch.tensor([[0.0, math.log(3.0)]], dtype=torch.float64)
    lp, ent = token_log_probs(logits, torch.tensor([1]))
    assert lp.item() == pytest.approx(math.log(0.75), abs=1e-12)
    assert ent.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-12)
    # temperature 2: softmax([0, ln 3 / 2]) = [1, sqrt 3] / (1 + sqrt 3)
    lp, _ = token_log_probs(logits, torch.tensor([0]), temperature=2.0)
    assert lp.item() == pytest.approx(-math.log(1 + math.sqrt(3)), abs=1e-12)
    with pytest.raises(ValueError, match="temperature"):
        token_log_probs(logits, torch.tensor([0]), temperature=0.0)


def test_token_log_probs_bf16_is_computed_in_float32(ref_log_softmax):
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    tokens = torch.tensor([1, 2, 3])
    lp, _ = token_log_probs(logits, tokens, 0.7)
    assert lp.dtype == torch.float32
    want = [
        ref_log_softmax(row, 0.7)[t] for row, t in zip(logits.double().tolist(), tokens.tolist(), strict=True)
    ]
    torch.testing.assert_close(lp.double(), torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-5)


def test_vocab_size_resolution(tmp_path):
    assert resolve_vocab_size(77, str(tmp_path)) == 77
    assert resolve_vocab_size(None, str(tmp_path)) == 256  # no config.json: the default
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 1031}))
    assert resolve_vocab_size(None, str(tmp_path)) == 1031
    assert resolve_vocab_size(None, "") == 256
    (tmp_path / "config.json").write_text("{broken")
    with pytest.raises(ValueError, match="config.json is not valid JSON"):
        resolve_vocab_size(None, str(tmp_path))

"""Off-policy correction weights and staleness against plain Python loops in float64."""

from __future__ import annotations

import math

import pytest
import torch
from rlcore.algorithms.off_policy import importance_weights, staleness, staleness_metrics


def _inputs(seed=0, B=4, R=6):
    g = torch.Generator().manual_seed(seed)
    behaviour = -torch.rand(B, R, generator=g, dtype=torch.float64) * 3
    proximal = behaviour + torch.randn(B, R, generator=g, dtype=torch.float64) * 0.8
    mask = torch.ones(B, R, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, 2] = 0  # an observation token inside a response
    mask[3, :] = 0  # a row with no model tokens
    return proximal.float(), behaviour.float(), mask


def _loop(proximal, behaviour, mask, correction, cap, level):
    B, R = mask.shape
    out = [[0.0] * R for _ in range(B)]
    raw_all, changed_tokens, changed_rows, rows = [], [], [], 0
    for i in range(B):
        tokens = [t for t in range(R) if mask[i, t]]
        if level == "sequence":
            w_seq = math.exp(sum(float(proximal[i, t]) - float(behaviour[i, t]) for t in tokens))
            if tokens:
                rows += 1
                changed_rows.append(cap is not None and w_seq > cap)
        for t in tokens:
            w = w_seq if level == "sequence" else math.exp(float(proximal[i, t]) - float(behaviour[i, t]))
            raw_all.append(w)
            changed = cap is not None and w > cap
            changed_tokens.append(changed)
            if correction == "tis":
                out[i][t] = min(w, cap) if cap is not None else w
            elif correction == "mask":
                out[i][t] = 0.0 if changed else 1.0
            else:
                out[i][t] = 0.0 if changed else w
    clipped = sum(changed_rows) / rows if level == "sequence" else sum(changed_tokens) / len(changed_tokens)
    return out, raw_all, clipped


@pytest.mark.parametrize(
    "correction,cap,level",
    [
        ("tis", 2.0, "token"),
        ("tis", 0.5, "sequence"),
        ("decoupled", 2.0, "token"),
        ("decoupled", None, "token"),
        ("tis", None, "token"),
        ("mask", 0.5, "sequence"),
        ("mask", 2.0, "token"),
    ],
)
def test_weights_match_a_plain_loop(correction, cap, level):
    proximal, behaviour, mask = _inputs()
    weights, metrics = importance_weights(
        proximal, behaviour, mask, correction=correction, cap=cap, level=level
    )
    expected, raw, clipped = _loop(proximal, behaviour, mask, correction, cap, level)
    torch.testing.assert_close(
        weights.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-6, atol=1e-7
    )
    assert metrics["off_policy/is_weight_max"] == pytest.approx(max(raw), rel=1e-6)
    assert metrics["off_policy/is_weight_min"] == pytest.approx(min(raw), rel=1e-6)
    assert metrics["off_policy/is_weight_mean"] == pytest.approx(sum(raw) / len(raw), rel=1e-6)
    assert metrics["off_policy/is_clipped_fraction"] == pytest.approx(clipped)
    if cap is not None:
        assert 0 < clipped < 1, "the inputs must exercise the cap both ways"


def test_no_weights_for_none_and_behaviour_and_a_clear_error_otherwise():
    proximal, behaviour, mask = _inputs()
    for correction in ("none", "behaviour"):
        assert importance_weights(proximal, behaviour, mask, correction=correction, cap=2.0) == (None, {})
    with pytest.raises(ValueError, match="algorithm.off_policy must be"):
        importance_weights(proximal, behaviour, mask, correction="is", cap=2.0)
    with pytest.raises(ValueError, match="algorithm.is_level"):
        importance_weights(proximal, behaviour, mask, correction="tis", cap=2.0, level="group")


def test_staleness_by_the_oldest_model_token():
    versions = torch.tensor([[3, 3, 4, -1], [5, 5, 5, 5], [1, 4, 4, 4], [2, 2, -1, -1]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [0, 1, 1, 1], [0, 0, 0, 0]])
    # row 2's version-1 token is an observation: it does not count; row 3 has no model tokens.
    assert staleness(versions, mask, 5).tolist() == [2, 0, 1, 0]
    m = staleness_metrics(versions, mask, 5)
    assert m["off_policy/staleness_max"] == 2 and m["off_policy/staleness_mean"] == pytest.approx(3 / 4)
    assert m["off_policy/staleness/0"] == 0.5 and m["off_policy/staleness/1"] == 0.25
    assert m["off_policy/staleness/2"] == 0.25
    assert m["off_policy/multi_version_fraction"] == 0.25  # row 0 spans versions 3 and 4

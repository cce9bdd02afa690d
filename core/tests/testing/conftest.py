"""Shared pieces of the rlcore.testing tests: an independent float64 reference of TinyLM."""

import math

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    # The fakes run tiny ops, where thread hand-offs cost more than the maths on a busy 2-core machine.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def reference_outputs(model, ids: list[int]) -> list[list[float]]:
    """TinyLM's outputs for one unpadded sequence, by a plain per-position Python loop in float64.

    Written from the formulas in the TinyLM docstring, not from its code: one list per position,
    holding the logits (``lm`` head) or the single value (``value``/``score`` heads).
    """
    w = {n: p.detach().double().tolist() for n, p in model.named_parameters()}
    emb = w["model.embed_tokens.weight"]
    head = w["lm_head.weight"] if "lm_head.weight" in w else w["score.weight"]

    def matvec(m, v):
        return [sum(a * b for a, b in zip(row, v, strict=True)) for row in m]

    def gelu(x):
        return 0.5 * x * (1 + math.erf(x / math.sqrt(2)))

    out = []
    for t, tok in enumerate(ids):
        h = list(emb[tok])
        if "model.prev_proj.weight" in w and t > 0:
            h = [a + b for a, b in zip(h, matvec(w["model.prev_proj.weight"], emb[ids[t - 1]]), strict=True)]
        up = [gelu(x) for x in matvec(w["model.mlp.up_proj.weight"], h)]
        h = [a + b for a, b in zip(h, matvec(w["model.mlp.down_proj.weight"], up), strict=True)]
        out.append(matvec(head, h))
    return out


def reference_log_softmax(logits: list[float], temperature: float = 1.0) -> list[float]:
    scaled = [x / temperature for x in logits]
    top = max(scaled)
    log_z = top + math.log(sum(math.exp(x - top) for x in scaled))
    return [x - log_z for x in scaled]


@pytest.fixture
def ref_outputs():
    """:func:`reference_outputs` (test modules cannot import conftest under ``--import-mode=importlib``)."""
    return reference_outputs


@pytest.fixture
def ref_log_softmax():
    """:func:`reference_log_softmax`."""
    return reference_log_softmax

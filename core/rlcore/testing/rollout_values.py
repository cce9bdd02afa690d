"""The rollout contract's value checks: what an engine reports is checked against an independent float64
recomputation of the same weights, not only for shape.

The convention every rollout engine follows (docs/plugins.md, section 5): ``Completion.log_probs[i]`` is
``log_softmax(z / T)[token_ids[i]]`` where ``z`` are the model's logits at that position and ``T`` the
request's temperature, taken before top-k/top-p filtering; greedy (``T == 0``) reports
``log_softmax(z)`` of the argmax. The trainer computes the same quantity (``EngineSpec.temperature``), so
the two agree up to numerics; the importance ratios of every policy loss depend on it.

The checks (methods of :class:`RolloutValueChecks`, mixed into
:class:`~rlcore.testing.contract.RolloutEngineContract`):

- sampled tokens' log-probs at temperature 1 and at :attr:`~RolloutValueChecks.other_temperature`;
- greedy: the argmax token, with ``log_softmax(z)``;
- top-k and top-p: every sampled token lies inside the filtered set.

A failure says which property broke: when the values are those of the most likely token rather than the
sampled one, or of ``log_softmax(z)`` whatever the temperature, the message names that mistake.

The reference is the fixture ``reference_logits``: a callable ``logits(sequences: list[list[int]]) ->
list[Tensor[L, V]]`` (float64, position ``t`` predicts token ``t + 1``). By default it is
:class:`ReferenceLogits`: the Hugging Face model of the fixture ``reference_model_path`` (default
``tiny_model_path``) with the engine's current weights (``rollout_weights``) loaded, in float64. An engine
built from another folder overrides ``reference_model_path``; one whose model is not a Hugging Face model
overrides ``reference_logits``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch

from rlcore.api import Completion, SamplingParams

Logits = Callable[[Sequence[Sequence[int]]], list[torch.Tensor]]


class ReferenceLogits:
    """float64 logits of token sequences from the Hugging Face model in ``model_path`` with ``weights``
    (``(hf_name, tensor)`` pairs, the rollout's current weights) loaded over it."""

    def __init__(self, model_path: str | Path, weights: Sequence[tuple[str, torch.Tensor]]):
        from transformers import AutoModelForCausalLM

        # eager attention: the plain softmax(QK^T)V, no fused kernel shared with any engine.
        self.model = AutoModelForCausalLM.from_pretrained(
            str(model_path), dtype=torch.float64, attn_implementation="eager"
        )
        state = {name: tensor.detach().to("cpu", torch.float64) for name, tensor in weights}
        unexpected = sorted(set(state) - set(self.model.state_dict()))
        if unexpected:
            raise ValueError(
                f"rollout_weights names {unexpected[:5]} are not parameters of the model in {model_path}: "
                "override the fixture reference_model_path with the folder the engine was built from"
            )
        self.model.load_state_dict(state, strict=False)
        self.model.eval()

    @torch.no_grad()
    def __call__(self, sequences: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        return [self.model(torch.tensor([list(s)])).logits[0] for s in sequences]


def _rows(
    completions: Sequence[Completion], reference_logits: Logits
) -> list[tuple[Completion, torch.Tensor]]:
    """Each completion with the reference logits ``[len(token_ids), V]`` that predict its tokens."""
    sequences = [list(c.prompt_ids) + list(c.token_ids) for c in completions]
    out = []
    for c, z in zip(completions, reference_logits(sequences), strict=True):
        start = len(c.prompt_ids) - 1
        out.append((c, z[start : start + len(c.token_ids)].to(torch.float64)))
    return out


def _first(values: torch.Tensor, count: int = 6) -> str:
    return (
        "["
        + ", ".join(f"{v:.4f}" for v in values[:count].tolist())
        + (", ...]" if len(values) > count else "]")
    )


def check_log_probs(
    completions: Sequence[Completion], reference_logits: Logits, temperature: float, atol: float
) -> None:
    """Assert each completion's ``log_probs`` equal ``log_softmax(z / T)`` of its tokens (``T = 1`` when
    greedy) within ``atol``; on failure, say which known mistake the values match."""
    scale = temperature if temperature > 0 else 1.0
    got, want, top, untempered = [], [], [], []
    for c, z in _rows(completions, reference_logits):
        assert c.log_probs is not None, "the completion has no log_probs (SamplingParams.logprobs is True)"
        tokens = torch.tensor(list(c.token_ids))[:, None]
        log_p = torch.log_softmax(z / scale, dim=-1)
        got.append(torch.tensor(list(c.log_probs), dtype=torch.float64))
        want.append(log_p.gather(-1, tokens)[:, 0])
        top.append(log_p.max(-1).values)
        untempered.append(torch.log_softmax(z, dim=-1).gather(-1, tokens)[:, 0])
    got_, want_, top_, untempered_ = (torch.cat(x) for x in (got, want, top, untempered))
    err = (got_ - want_).abs()
    if float(err.max()) <= atol:
        return
    what = f"log_softmax(z / {scale:g})" if scale != 1.0 else "log_softmax(z)"
    if float((got_ - top_).abs().max()) <= atol:
        cause = (
            "they are the log-probs of the most likely token at each position, not of the token that was "
            "sampled: report the sampled token's log-prob"
        )
    elif scale != 1.0 and float((got_ - untempered_).abs().max()) <= atol:
        cause = (
            f"they equal log_softmax(z) at temperature 1: the engine ignores temperature={temperature:g} in its "
            "log-probs (they must be of logits / temperature, as the trainer computes them)"
        )
    else:
        cause = "they match neither the sampled tokens' log-probs nor a known mistake"
    raise AssertionError(
        f"rollout log-probs at temperature {temperature:g} differ from the float64 reference {what} of the "
        f"sampled tokens by up to {float(err.max()):.4g} (mean {float(err.mean()):.4g}; tolerance "
        f"reference_atol={atol:g}): {cause}.\n  engine:    {_first(got_)}\n  reference: {_first(want_)}"
    )


def check_greedy_tokens(completions: Sequence[Completion], reference_logits: Logits, atol: float) -> None:
    """Assert every greedy token is a most likely token of the reference (within ``atol``: near ties)."""
    for i, (c, z) in enumerate(_rows(completions, reference_logits)):
        log_p = torch.log_softmax(z, dim=-1)
        for t, token in enumerate(c.token_ids):
            best = int(log_p[t].argmax())
            assert float(log_p[t, best] - log_p[t, token]) <= atol, (
                f"greedy completion {i}, token {t}: the engine chose {token} (reference log-prob "
                f"{float(log_p[t, token]):.4f}) but the most likely token is {best} ({float(log_p[t, best]):.4f})"
            )


def check_filters(
    completions: Sequence[Completion], reference_logits: Logits, params: SamplingParams, atol: float
) -> None:
    """Assert every sampled token survives ``params``' top-k and top-p (applied to ``softmax(z / T)``)."""
    for i, (c, z) in enumerate(_rows(completions, reference_logits)):
        probs = torch.softmax(z / params.temperature, dim=-1)
        for t, token in enumerate(c.token_ids):
            p = probs[t]
            # Tokens clearly more likely than the sampled one (within atol in log-prob they tie, and an
            # engine may order ties either way).
            above = p > p[token] * math.exp(atol)
            if params.top_k > 0:
                rank = int(above.sum())
                assert rank < params.top_k, (
                    f"completion {i}, token {t}: sampled {token}, ranked {rank + 1} by the reference, outside "
                    f"top_k={params.top_k}"
                )
            if params.top_p < 1.0:
                mass = float(p[above].sum())
                assert mass < params.top_p + atol, (
                    f"completion {i}, token {t}: sampled {token} after tokens holding {mass:.4f} of the "
                    f"probability, outside top_p={params.top_p:g} (the nucleus ends before it)"
                )


class RolloutValueChecks:
    """Value checks of the rollout contract (see the module doc). Tune with the class attributes."""

    #: Largest |engine - float64 reference| of a token's log-prob. fp32 engines land near 1e-5 on the tiny
    #: model; an engine computing in bf16 needs about 0.1.
    reference_atol = 1e-3
    #: The temperature other than 1 at which log-probs are checked.
    other_temperature = 0.7
    #: Completions per prompt in the value checks.
    value_samples = 4

    @pytest.fixture
    def reference_model_path(self, tiny_model_path):
        """The Hugging Face folder the engine under test was built from (override if not the tiny model)."""
        return tiny_model_path

    @pytest.fixture
    def reference_logits(self, reference_model_path, rollout_weights) -> Logits:
        """float64 logits from the engine's current weights (override for a non-Hugging Face model)."""
        return ReferenceLogits(reference_model_path, rollout_weights)

    def _sample(self, engine, **params) -> list[Completion]:
        params = SamplingParams(n=self.value_samples, max_tokens=self.max_tokens, **params)
        return [c for completions in engine.generate(self.prompts(), params) for c in completions]

    def test_sampled_log_probs_match_reference(self, rollout_engine, reference_logits):
        completions = self._sample(rollout_engine, temperature=1.0, seed=21)
        check_log_probs(completions, reference_logits, 1.0, self.reference_atol)

    def test_log_probs_follow_temperature(self, rollout_engine, reference_logits):
        t = self.other_temperature
        completions = self._sample(rollout_engine, temperature=t, seed=22)
        check_log_probs(completions, reference_logits, t, self.reference_atol)

    def test_greedy_matches_reference(self, rollout_engine, reference_logits):
        completions = self.greedy(rollout_engine)
        check_greedy_tokens(completions, reference_logits, self.reference_atol)
        check_log_probs(completions, reference_logits, 0.0, self.reference_atol)

    def test_top_k_and_top_p_are_respected(self, rollout_engine, reference_logits):
        for filters in ({"top_k": 3, "seed": 23}, {"top_p": 0.3, "seed": 24}):
            completions = self._sample(rollout_engine, temperature=1.0, **filters)
            params = SamplingParams(temperature=1.0, **filters)
            check_filters(completions, reference_logits, params, self.reference_atol)

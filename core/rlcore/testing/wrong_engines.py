"""Rollout engines with the log-prob mistakes third-party authors make, for the tests that the contract
suite and the post-sync check catch them (and for a plugin author's own tests).

Each mistake is a mixin over an engine that has ``self.model`` (a Hugging Face causal LM) and
``self.device``: it generates as the engine does, then replaces each completion's log-probs with the
wrong ones, computed from the engine's own model in its own dtype (a bf16 engine's wrong log-probs carry
bf16 noise, as a real one's would)::

    class ArgmaxVLLM(ArgmaxLogProbs, MyRollout): ...
"""

from __future__ import annotations

import torch

from rlcore.rollout.hf import HFRollout


def _logits(model, device, completion) -> torch.Tensor:
    """The engine's own logits ``[len(token_ids), V]`` (float64) at the completion's tokens."""
    ids = torch.tensor([list(completion.prompt_ids) + list(completion.token_ids)], device=device)
    with torch.no_grad():
        out = model(ids)
    z = (out.logits if hasattr(out, "logits") else out)[0, len(completion.prompt_ids) - 1 : -1]
    return z.double().cpu()


class ArgmaxLogProbs:
    """Reports, for every position, the log-prob of the most likely token instead of the sampled one's."""

    def generate(self, prompts, params):
        out = super().generate(prompts, params)
        scale = params.temperature if params.temperature > 0 else 1.0
        for c in (c for completions in out for c in completions):
            z = _logits(self.model, self.device, c)
            c.log_probs = torch.log_softmax(z / scale, dim=-1).max(-1).values.tolist()
        return out


class NoTemperatureLogProbs:
    """Samples at the requested temperature but reports ``log_softmax(z)``, as if it were 1."""

    def generate(self, prompts, params):
        out = super().generate(prompts, params)
        for c in (c for completions in out for c in completions):
            z = _logits(self.model, self.device, c)
            tokens = torch.tensor(list(c.token_ids))[:, None]
            c.log_probs = torch.log_softmax(z, dim=-1).gather(-1, tokens)[:, 0].tolist()
        return out


class ArgmaxHF(ArgmaxLogProbs, HFRollout):
    """Core's HF rollout with the argmax mistake."""


class NoTemperatureHF(NoTemperatureLogProbs, HFRollout):
    """Core's HF rollout ignoring the temperature in its log-probs."""

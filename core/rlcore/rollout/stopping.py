"""Where a sampled response ends: an end-of-sequence token, a stop string, or a length cap.

The same decoding decides both when generation stops early (:class:`StopStrings`, a ``transformers``
stopping criterion) and where the returned response is cut (:func:`finish_response`), so the two can
never disagree. Conventions follow vLLM's defaults: the token that ends a response (eos, or the one that
completes a stop string) stays in ``token_ids`` so the policy learns to stop; the text excludes the stop
string and special tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import attrs
import torch
from transformers import StoppingCriteria

#: ``decode(token_ids) -> text`` without special tokens.
Decode = Callable[[Sequence[int]], str]


@attrs.define
class Finished:
    """A response cut at its end: ``token_ids``, their ``log_probs``, ``text`` and ``finish_reason``."""

    token_ids: list[int]
    log_probs: list[float]
    text: str
    finish_reason: str  # "stop" | "length"


class StopStrings(StoppingCriteria):
    """Marks a row done once the decoded text of its generated part contains one of ``stop``.

    Decodes each unfinished row's whole response every step (``O(steps^2)`` per row): exact for any
    tokenizer, and cheap next to a forward pass at the lengths the reference engine is used for.
    """

    def __init__(self, stop: Sequence[str], decode: Decode, prompt_width: int):
        self.stop, self.decode, self.prompt_width = tuple(stop), decode, prompt_width
        self._done: set[int] = set()

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        generated = input_ids[:, self.prompt_width :].tolist()
        for row, tokens in enumerate(generated):
            if row not in self._done and _first_stop(self.decode(tokens), self.stop) is not None:
                self._done.add(row)
        done = [row in self._done for row in range(len(generated))]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def _first_stop(text: str, stop: Sequence[str]) -> int | None:
    """Index in ``text`` where the earliest stop string starts, or ``None``."""
    found = [i for i in (text.find(s) for s in stop) if i >= 0]
    return min(found) if found else None


def finish_response(
    token_ids: Sequence[int],
    log_probs: Sequence[float],
    *,
    eos_ids: Collection[int],
    stop: Sequence[str],
    decode: Decode,
    max_len: int,
) -> Finished:
    """Cut one generated row (which may run on past its end with padding) at its real end.

    ``token_ids`` and ``log_probs`` are the row's generated part, aligned. The response ends at the
    first of: the token completing a stop string (finish ``"stop"``, text cut before the stop string),
    the first eos token (``"stop"``, kept), or ``max_len`` tokens (``"length"``).
    """
    tokens = list(token_ids[:max_len])
    lps = list(log_probs[:max_len])
    eos_at = next((i for i, t in enumerate(tokens) if t in eos_ids), None)
    limit = len(tokens) if eos_at is None else eos_at + 1
    if stop and _first_stop(decode(tokens[:limit]), stop) is not None:
        # Containment of a stop string only grows with the prefix, so bisect for the shortest one.
        lo, hi = 1, limit
        while lo < hi:
            mid = (lo + hi) // 2
            if _first_stop(decode(tokens[:mid]), stop) is None:
                lo = mid + 1
            else:
                hi = mid
        text = decode(tokens[:lo])
        return Finished(tokens[:lo], lps[:lo], text[: _first_stop(text, stop)], "stop")
    if eos_at is not None:
        return Finished(tokens[:limit], lps[:limit], decode(tokens[:limit]), "stop")
    return Finished(tokens, lps, decode(tokens), "length")

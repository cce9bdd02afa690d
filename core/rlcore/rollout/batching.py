"""Completions to the standard batch layout (see :mod:`rlcore.api.batch`).

Every generation phase goes through :func:`completions_to_batch`: prompts left-padded, responses
right-padded, so ``input_ids = cat(prompts, responses)`` has every prompt ending at column ``P`` and every
response starting there, which is what train engines slice log-probs by.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlcore.api import Batch, Completion


def completions_to_batch(
    completions: Sequence[Completion] | Sequence[Sequence[Completion]],
    pad_token_id: int,
    *,
    prompt_length: int | None = None,
    response_length: int | None = None,
) -> Batch:
    """Stack completions into a :class:`~rlcore.api.Batch` of ``B`` rows.

    ``completions`` is flat or, as :meth:`RolloutEngine.generate` returns it, one list per prompt;
    nested lists are flattened prompt-major (prompt ``i``'s samples are rows ``i*n .. i*n+n-1``, the order
    of ``Batch.repeat(n, interleave=True)``). ``P``/``R`` default to the longest prompt/response;
    ``prompt_length``/``response_length`` fix them (a longer row is an error).

    Tensors: ``prompts [B, P]`` (left-padded with ``pad_token_id``), ``responses [B, R]`` (right-padded),
    ``input_ids [B, P+R]``, ``attention_mask [B, P+R]`` (1 on real tokens), ``position_ids [B, P+R]``
    (``cumsum(attention_mask) - 1``, 0 on left padding, the last real position repeated on right
    padding), ``response_mask [B, R]`` (1 on response tokens, the final eos included), all int64; and
    ``rollout_log_probs [B, R]`` float32 (0 on padding) when the completions carry log-probs; and
    ``policy_version [B, R]`` int64 (-1 on padding) when they carry ``versions``.

    A multi-turn completion (``Completion.response_mask`` set) keeps its mask: ``response_mask`` is 1 on
    model tokens and 0 on tool-observation tokens (and on padding), while ``attention_mask`` is 1 on
    every real token, observations included (the model reads them). ``rollout_log_probs`` is 0 wherever
    ``response_mask`` is 0.

    Objects: ``response_text``, ``finish_reason``, and ``agent_info`` (each completion's ``info``, ``{}``
    when it has none) when any completion carries one. Meta: ``pad_token_id`` (by which
    :meth:`Batch.concat <rlcore.api.Batch.concat>` pads batches of other widths to this layout).
    """
    flat = _flatten(completions)
    if not flat:
        raise ValueError("completions_to_batch: no completions given")
    P = _width("prompt", [len(c.prompt_ids) for c in flat], prompt_length)
    R = _width("response", [len(c.token_ids) for c in flat], response_length)
    B = len(flat)
    prompts = torch.full((B, P), pad_token_id, dtype=torch.long)
    responses = torch.full((B, R), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((B, P), dtype=torch.long)
    response_mask = torch.zeros((B, R), dtype=torch.long)
    with_log_probs = [c.log_probs is not None for c in flat]
    if any(with_log_probs) and not all(with_log_probs):
        row = with_log_probs.index(not with_log_probs[0])
        has = {True: "has", False: "lacks"}
        raise ValueError(
            f"completions_to_batch: row 0 {has[with_log_probs[0]]} log-probs but row {row} "
            f"{has[with_log_probs[row]]} them; generate all rows with the same SamplingParams.logprobs"
        )
    log_probs = torch.zeros((B, R), dtype=torch.float32) if all(with_log_probs) else None
    token_mask = torch.zeros((B, R), dtype=torch.long)  # every real response token, observations included
    for i, c in enumerate(flat):
        p, r = len(c.prompt_ids), len(c.token_ids)
        if p:
            prompts[i, P - p :] = torch.as_tensor(c.prompt_ids, dtype=torch.long)
            prompt_mask[i, P - p :] = 1
        if r:
            responses[i, :r] = torch.as_tensor(c.token_ids, dtype=torch.long)
            token_mask[i, :r] = 1
            response_mask[i, :r] = _model_token_mask(c, i)
        if log_probs is not None:
            if len(c.log_probs) != r:
                raise ValueError(
                    f"completions_to_batch: row {i} has {r} response tokens but {len(c.log_probs)} log-probs"
                )
            if r:
                log_probs[i, :r] = torch.as_tensor(c.log_probs, dtype=torch.float32) * response_mask[i, :r]
    attention_mask = torch.cat([prompt_mask, token_mask], dim=1)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(dim=1) - 1).clamp(min=0),
        "response_mask": response_mask,
    }
    if log_probs is not None:
        tensors["rollout_log_probs"] = log_probs
    if any(c.versions is not None for c in flat):
        tensors["policy_version"] = _versions(flat, R)
    objects = {"response_text": [c.text for c in flat], "finish_reason": [c.finish_reason for c in flat]}
    if any(c.info is not None for c in flat):
        objects["agent_info"] = [dict(c.info or {}) for c in flat]
    return Batch(tensors, objects, {"pad_token_id": pad_token_id})


def _versions(flat: list[Completion], width: int) -> torch.Tensor:
    """``policy_version [B, R]`` int64: the version that sampled each response token, -1 on padding."""
    out = torch.full((len(flat), width), -1, dtype=torch.long)
    for i, c in enumerate(flat):
        if c.versions is None or len(c.versions) != len(c.token_ids):
            have = "none" if c.versions is None else f"{len(c.versions)}"
            raise ValueError(
                f"completions_to_batch: row {i} has {len(c.token_ids)} response tokens but {have} policy "
                "versions; stamp every completion of a batch (rlcore.rollout.partial does)"
            )
        out[i, : len(c.versions)] = torch.as_tensor(c.versions, dtype=torch.long)
    return out


def _model_token_mask(completion: Completion, row: int) -> torch.Tensor:
    """``[r]`` int64: the completion's own ``response_mask`` (checked), or all ones."""
    r = len(completion.token_ids)
    if completion.response_mask is None:
        return torch.ones(r, dtype=torch.long)
    mask = torch.as_tensor(completion.response_mask, dtype=torch.long)
    if mask.shape != (r,) or bool(((mask != 0) & (mask != 1)).any()):
        raise ValueError(
            f"completions_to_batch: row {row} has {r} response tokens but its response_mask is "
            f"{completion.response_mask[:16]!r}{'...' if len(completion.response_mask) > 16 else ''} "
            f"({len(completion.response_mask)} entries); it needs one 0/1 entry per token"
        )
    return mask


def _flatten(completions: Sequence[Completion] | Sequence[Sequence[Completion]]) -> list[Completion]:
    flat: list[Completion] = []
    for i, item in enumerate(completions):
        if isinstance(item, Completion):
            flat.append(item)
        elif isinstance(item, Sequence) and all(isinstance(c, Completion) for c in item):
            flat.extend(item)
        else:
            raise TypeError(
                f"completions_to_batch: item {i} is a {type(item).__name__}; expected a Completion or a "
                f"list of them (one per prompt, as RolloutEngine.generate returns)"
            )
    return flat


def _width(what: str, lengths: list[int], fixed: int | None) -> int:
    longest = max(lengths)
    if fixed is None:
        return longest
    if longest > fixed:
        row = lengths.index(longest)
        raise ValueError(
            f"completions_to_batch: row {row} has a {what} of {longest} tokens, longer than "
            f"{what}_length={fixed}; raise it or cap generation (max_tokens / data.max_prompt_length)"
        )
    return fixed

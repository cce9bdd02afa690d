"""Advantage estimators: pure tensor functions returning ``(advantages, returns)``, each ``[B, T]``.

Keyword names are verl's (``token_level_rewards``, ``response_mask``, ``index``, ``values``, ``gamma``,
``lam``, ``epsilon``, ``norm_adv_by_std_in_grpo``, ``reward_baselines``), so a verl recipe ports by name.
Each estimator names only the inputs it uses; :func:`rlcore.algorithms.compute_advantage` hands an
estimator the subset of the available inputs that its signature asks for.

Shapes: ``token_level_rewards``, ``response_mask``, ``values``: ``[B, T]`` (``T`` response tokens);
``index``: ``B`` group ids (the prompt's ``uid``: any hashables, a list, numpy array or tensor);
``reward_baselines``: ``[B]``.

Conventions shared by all estimators:

* Outcome estimators use the sequence score ``s_i = sum_t token_level_rewards[i, t]``.
* Group statistics are computed in float64, and a group whose scores are all equal gets advantage exactly 0
  (float rounding of the group mean would otherwise leave noise that the std division blows up).
* Results are float32 (float64 for float64 inputs), and 0 wherever ``response_mask`` is 0.
* Masked tokens inside a response (tool observations in multi-turn rollouts) are skipped by the
  token-level recursions: the value / return is carried through them, as verl's GAE does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rlcore.algorithms.aggregation import masked_whiten


# --------------------------------------------------------------------------------------- helpers
def _out_dtype(*tensors: torch.Tensor) -> torch.dtype:
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype) if t.is_floating_point() else dtype
    return dtype


def _check_token_tensor(name: str, tensor: Any, shape: torch.Size | None) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape [B, T], got {type(tensor).__name__}")
    if tensor.dim() != 2:
        raise ValueError(f"{name} must be [B, T], got shape {tuple(tensor.shape)}")
    if shape is not None and tensor.shape != shape:
        raise ValueError(
            f"{name} has shape {tuple(tensor.shape)}, but token_level_rewards has {tuple(shape)}"
        )
    return tensor


def _inputs(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    _check_token_tensor("token_level_rewards", token_level_rewards, None)
    _check_token_tensor("response_mask", response_mask, token_level_rewards.shape)
    return token_level_rewards, response_mask.bool()


def _group_ids(index: Sequence[Any] | Any, batch_size: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """Dense group numbers ``[B]`` (in order of first appearance) and the number of groups."""
    if index is None:
        raise ValueError("this estimator needs `index` (the group id of each sample, e.g. batch['uid'])")
    keys = index.tolist() if hasattr(index, "tolist") else list(index)
    if len(keys) != batch_size:
        raise ValueError(f"index has {len(keys)} entries but the batch has {batch_size} samples")
    numbering: dict[Any, int] = {}
    ids = [numbering.setdefault(k, len(numbering)) for k in keys]
    return torch.tensor(ids, dtype=torch.long, device=device), len(numbering)


def _group_stats(scores: torch.Tensor, gid: torch.Tensor, n_groups: int):
    """Per-sample ``(count, mean, unbiased std, all_equal)`` of its group; ``scores`` float64 ``[B]``."""
    count = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(
        0, gid, torch.ones_like(scores)
    )
    total = torch.zeros_like(count).index_add_(0, gid, scores)
    mean = total / count
    sq = torch.zeros_like(count).index_add_(0, gid, (scores - mean[gid]) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    hi = torch.full_like(count, -torch.inf).scatter_reduce_(0, gid, scores, "amax")
    lo = torch.full_like(count, torch.inf).scatter_reduce_(0, gid, scores, "amin")
    return count[gid], mean[gid], std[gid], (hi == lo)[gid]


def _broadcast(per_sample: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[B]`` -> ``[B, T]`` on valid tokens, 0 elsewhere."""
    return (per_sample.unsqueeze(-1) * mask).to(dtype)


def _scores(token_level_rewards: torch.Tensor) -> torch.Tensor:
    # All tokens, as verl: a reward is placed on a valid token, so the mask changes nothing here.
    return token_level_rewards.double().sum(dim=-1)


def _discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = r_t + gamma * G_next`` over valid tokens, carried unchanged through masked ones."""
    running = torch.zeros_like(rewards[:, 0])
    out = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(mask[:, t], rewards[:, t] + gamma * running, running)
        out[:, t] = running
    return torch.where(mask, out, torch.zeros_like(out))


# --------------------------------------------------------------------------------------- estimators
@torch.no_grad()
def gae(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2016, https://arxiv.org/abs/1506.02438).

    Over the valid tokens ``t_1 < t_2 < ...`` of a row (observation tokens skipped):
    ``delta_k = r_k + gamma * V_{k+1} - V_k`` (``V`` past the last token is 0),
    ``A_k = delta_k + gamma * lam * A_{k+1}``, returns ``A_k + V_k``. Advantages are then whitened over all
    valid tokens of the batch. ``values``: the critic's ``[B, T]``.
    """
    rewards, mask = _inputs(token_level_rewards, response_mask)
    _check_token_tensor("values", values, rewards.shape)
    dtype = _out_dtype(rewards, values)
    r, v = rewards.to(dtype), values.to(dtype)
    next_value = torch.zeros_like(r[:, 0])
    last_gae = torch.zeros_like(r[:, 0])
    adv = torch.zeros_like(r)
    for t in reversed(range(r.shape[1])):
        delta = r[:, t] + gamma * next_value - v[:, t]
        gae_t = delta + gamma * lam * last_gae
        valid = mask[:, t]
        # An observation token neither has a TD error nor interrupts the recursion between turns.
        next_value = torch.where(valid, v[:, t], next_value)
        last_gae = torch.where(valid, gae_t, last_gae)
        adv[:, t] = last_gae
    zeros = torch.zeros_like(adv)
    returns = torch.where(mask, adv + v, zeros)
    return masked_whiten(torch.where(mask, adv, zeros), mask), returns


@torch.no_grad()
def grpo(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO (Shao et al. 2024, https://arxiv.org/abs/2402.03300): ``A_i = (s_i - mean_g) / (std_g + eps)``.

    ``std_g`` is the unbiased std of the group. With ``norm_adv_by_std_in_grpo=False``: ``A_i = s_i -
    mean_g`` (Dr. GRPO, Liu et al. 2025, https://arxiv.org/abs/2503.20783). A group of one sample has
    mean 0 and std 1, as in verl. Advantages equal returns.
    """
    rewards, mask = _inputs(token_level_rewards, response_mask)
    scores = _scores(rewards)
    gid, n = _group_ids(index, scores.shape[0], scores.device)
    count, mean, std, equal = _group_stats(scores, gid, n)
    single = count == 1
    mean = torch.where(single, 0.0, mean)
    centred = torch.where(equal & ~single, 0.0, scores - mean)
    if norm_adv_by_std_in_grpo:
        centred = centred / (torch.where(single, 1.0, std) + epsilon)
    adv = _broadcast(centred, mask, _out_dtype(rewards))
    return adv, adv


@torch.no_grad()
def grpo_passk(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k GRPO (Chen et al. 2025, https://arxiv.org/abs/2503.19595).

    Only the best sample of each group learns: ``A = s_max - s_second`` (divided by ``std_g + eps`` when
    ``norm_adv_by_std_in_grpo``); every other sample gets 0. On ties the earliest best sample is chosen
    (its advantage is then 0 anyway). Every group needs at least two samples.
    """
    rewards, mask = _inputs(token_level_rewards, response_mask)
    scores = _scores(rewards)
    gid, n = _group_ids(index, scores.shape[0], scores.device)
    count, _, std, _ = _group_stats(scores, gid, n)
    if bool((count < 2).any()):
        row = int((count < 2).nonzero()[0])
        raise ValueError(
            f"grpo_passk needs at least 2 samples per group; sample {row} (index {list(index)[row]!r}) is alone. "
            "Generate several responses per prompt (rollout n >= 2)."
        )
    per_sample = torch.zeros_like(scores)
    for g in range(n):
        rows = (gid == g).nonzero().flatten()
        group = scores[rows]
        order = torch.sort(group, descending=True, stable=True).indices
        best = rows[order[0]]
        gap = group[order[0]] - group[order[1]]
        per_sample[best] = gap / (std[best] + epsilon) if norm_adv_by_std_in_grpo else gap
    adv = _broadcast(per_sample, mask, _out_dtype(rewards))
    return adv, adv


@torch.no_grad()
def rloo(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE leave-one-out (Ahmadian et al. 2024, https://arxiv.org/abs/2402.14740).

    ``A_i = s_i - mean_{j != i} s_j = n / (n - 1) * (s_i - mean_g)``; a group of one keeps ``A_i = s_i``.
    """
    rewards, mask = _inputs(token_level_rewards, response_mask)
    scores = _scores(rewards)
    gid, n = _group_ids(index, scores.shape[0], scores.device)
    count, mean, _, equal = _group_stats(scores, gid, n)
    loo = torch.where(equal, 0.0, (scores - mean) * count / (count - 1).clamp(min=1))
    per_sample = torch.where(count > 1, loo, scores)
    adv = _broadcast(per_sample, mask, _out_dtype(rewards))
    return adv, adv


@torch.no_grad()
def reinforce_plus_plus(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, https://arxiv.org/abs/2501.03262).

    Token returns ``G_t = r_t + gamma * G_{t+1}`` (KL-shaped rewards in the original), whitened over all
    valid tokens of the batch. Returns ``G``. Observation tokens are skipped (verl instead restarts the
    sum at every masked token, so earlier turns of a multi-turn rollout would see no outcome reward).
    """
    rewards, mask = _inputs(token_level_rewards, response_mask)
    returns = _discounted_returns(rewards.to(_out_dtype(rewards)), mask, gamma)
    return masked_whiten(returns, mask), returns


@torch.no_grad()
def reinforce_plus_plus_baseline(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group baseline (Hu 2025, https://arxiv.org/abs/2501.03262).

    ``s_i - mean_g`` on every valid token (group of one: mean 0), then whitened over all valid tokens of the
    batch. Advantages equal returns.
    """
    rewards, mask = _inputs(token_level_rewards, response_mask)
    scores = _scores(rewards)
    gid, n = _group_ids(index, scores.shape[0], scores.device)
    count, mean, _, equal = _group_stats(scores, gid, n)
    centred = torch.where(count == 1, scores, torch.where(equal, 0.0, scores - mean))
    adv = masked_whiten(_broadcast(centred, mask, torch.float64), mask).to(_out_dtype(rewards))
    return adv, adv


@torch.no_grad()
def remax(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    reward_baselines: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023, https://arxiv.org/abs/2310.10505).

    ``G_t = sum_{t' >= t} r_t'`` over valid tokens, ``A_t = G_t - b`` with ``b`` (``reward_baselines
    [B]``) the score of the greedy response to the same prompt. Returns ``G``.
    """
    rewards, mask = _inputs(token_level_rewards, response_mask)
    baselines = torch.as_tensor(reward_baselines, device=rewards.device)
    if baselines.shape != rewards.shape[:1]:
        raise ValueError(
            f"reward_baselines must be [B] = [{rewards.shape[0]}] (one greedy score per sample), "
            f"got {tuple(baselines.shape)}"
        )
    dtype = _out_dtype(rewards, baselines)
    returns = _discounted_returns(rewards.to(dtype), mask, 1.0)
    adv = returns - _broadcast(baselines.to(dtype), mask, dtype)
    return adv, returns


@torch.no_grad()
def opo(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
) -> tuple[torch.Tensor, torch.Tensor]:
    """On-Policy RL with the optimal baseline (Hao et al. 2025, https://arxiv.org/abs/2505.23585).

    ``A_i = s_i - b_g`` with the length-weighted baseline ``b_g = sum_j |o_j| s_j / sum_j |o_j|`` over
    the group (``|o_j|`` = valid tokens). A group of one, or one with no valid tokens, has ``b_g = 0``.
    """
    rewards, mask = _inputs(token_level_rewards, response_mask)
    scores = _scores(rewards)
    lengths = mask.sum(dim=-1).double()
    gid, n = _group_ids(index, scores.shape[0], scores.device)
    count, _, _, equal = _group_stats(scores, gid, n)
    weighted = torch.zeros(n, dtype=torch.float64, device=scores.device).index_add_(0, gid, lengths * scores)
    total_len = torch.zeros(n, dtype=torch.float64, device=scores.device).index_add_(0, gid, lengths)
    baseline = (weighted / total_len.clamp(min=1))[gid]
    baseline = torch.where(count == 1, 0.0, baseline)
    per_sample = torch.where(equal & (count > 1), 0.0, scores - baseline)
    adv = _broadcast(per_sample, mask, _out_dtype(rewards))
    return adv, adv


@torch.no_grad()
def gpg(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    f_norm: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group Policy Gradient (Chu et al. 2025, https://arxiv.org/abs/2504.02546).

    ``A_i = alpha * (s_i - mean_g) / f_norm`` with ``alpha = B / max(1, #{i: s_i != 0})``, the batch-level
    correction for samples that carry no signal (verl's choice of counting non-zero scores). A group of
    one has mean 0.
    """
    rewards, mask = _inputs(token_level_rewards, response_mask)
    scores = _scores(rewards)
    gid, n = _group_ids(index, scores.shape[0], scores.device)
    count, mean, _, equal = _group_stats(scores, gid, n)
    alpha = scores.shape[0] / max(int((scores != 0).sum()), 1)
    centred = torch.where(count == 1, scores, torch.where(equal, 0.0, scores - mean))
    adv = _broadcast(alpha * centred / f_norm, mask, _out_dtype(rewards))
    return adv, adv

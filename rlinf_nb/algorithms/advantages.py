"""Critic-free on-policy advantages (GRPO, DAPO, Reinforce++) as pure torch functions.

Like :mod:`.functional`, every function is stateless: tensors in, tensors (or named
tuples of tensors) out, tested against slow reference loops in ``tests/test_advantages.py``.

Shape conventions:

* ``T`` = time steps of a rollout, ``N`` = parallel envs; rollout tensors are ``[T, N]``.
* ``E`` = episodes found in a rollout (see :func:`segment_episodes`); per-episode
  tensors are ``[E]``. Episodes are numbered env-major: all episodes of env 0 in time
  order, then those of env 1, and so on.
* A *group* is a set of episodes that started from the same reset seed (GRPO's "several
  answers to one prompt"). The runtime resets the envs of one group with a shared seed;
  :func:`episode_group_ids` turns "env ``n`` belongs to env-group ``g``" into per-episode
  group ids: the ``k``-th episode of every env in env-group ``g`` forms one group.
* ``mask``/``valid``: bool, ``True`` = a valid entry (as in :mod:`.functional`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .functional import PolicyLossTerms, masked_mean, normalize_advantages

__all__ = [
    "AGGREGATIONS",
    "EpisodeLayout",
    "GroupAdvantages",
    "aggregate_loss",
    "clipped_surrogate_loss",
    "discounted_returns",
    "dynamic_sampling_mask",
    "episode_group_ids",
    "episode_sums",
    "grpo_advantages",
    "reinforce_pp_advantages",
    "segment_episodes",
]

AGGREGATIONS = ("step-mean", "episode-mean")


def _bool(x: Tensor) -> Tensor:
    return x if x.dtype == torch.bool else x != 0


# ----------------------------------------------------------------------------- episodes


class EpisodeLayout(NamedTuple):
    """Where the episodes of a ``[T, N]`` rollout are.

    Attributes:
        episode_ids: ``[T, N]`` int64, the episode (``0..E-1``) each step belongs to.
        env: ``[E]`` int64, the env each episode ran in.
        ordinal: ``[E]`` int64, ``k`` for the ``k``-th episode (from 0) of its env in this rollout.
        finished: ``[E]`` bool, the episode ended (terminated or truncated) inside the rollout;
            only the last episode of an env can be unfinished.
        lengths: ``[E]`` int64, its number of steps in the rollout.
    """

    episode_ids: Tensor
    env: Tensor
    ordinal: Tensor
    finished: Tensor
    lengths: Tensor

    @property
    def num_episodes(self) -> int:
        return int(self.env.numel())


def segment_episodes(dones: Tensor) -> EpisodeLayout:
    """Split a rollout into episodes at its ``dones``.

    Shapes:
        dones: ``[T, N]`` (bool or 0/1; ``True`` = the episode ended at this step, by
        termination or truncation). Returns an :class:`EpisodeLayout`.

    A new episode starts at ``t = 0`` and after every done. The first episode of an env
    may have started before the rollout (the runtime decides whether that happens; GRPO
    rollouts reset every env at ``t = 0``).
    """
    if dones.dim() != 2:
        raise ValueError(f"segment_episodes expects dones of shape [T, N], got {tuple(dones.shape)}")
    done = _bool(dones)
    T, N = done.shape
    starts = torch.zeros(T, N, dtype=torch.int64, device=done.device)
    starts[0] = 1
    starts[1:] = done[:-1].to(torch.int64)
    ordinal_steps = starts.cumsum(0) - 1  # [T, N]
    counts = ordinal_steps[-1] + 1  # [N] episodes per env
    offsets = torch.cumsum(counts, 0) - counts  # [N] first episode id of each env
    episode_ids = offsets.unsqueeze(0) + ordinal_steps
    E = int(counts.sum())
    env = torch.repeat_interleave(torch.arange(N, device=done.device), counts)
    ordinal = torch.arange(E, device=done.device) - offsets[env]
    lengths = torch.zeros(E, dtype=torch.int64, device=done.device)
    lengths.scatter_add_(0, episode_ids.reshape(-1), torch.ones(T * N, dtype=torch.int64, device=done.device))
    finished = torch.ones(E, dtype=torch.bool, device=done.device)
    last_of_env = offsets + counts - 1
    finished[last_of_env] = done[-1]
    return EpisodeLayout(episode_ids, env, ordinal, finished, lengths)


def episode_sums(values: Tensor, episode_ids: Tensor, num_episodes: int) -> Tensor:
    """Sum ``values`` over the steps of each episode (undiscounted episode returns for rewards).

    Shapes:
        values: ``[T, N]``; episode_ids: ``[T, N]`` int64 in ``0..num_episodes-1``.
        Returns ``[num_episodes]`` in the dtype of ``values``.
    """
    out = torch.zeros(num_episodes, dtype=values.dtype, device=values.device)
    return out.scatter_add(0, episode_ids.reshape(-1), values.reshape(-1))


def episode_group_ids(layout: EpisodeLayout, env_groups: Tensor) -> Tensor:
    """Per-episode group ids: the ``k``-th episodes of the envs of one env-group form a group.

    Shapes:
        env_groups: ``[N]`` int64, the env-group (shared reset seed) of each env, e.g.
        ``arange(N) // group_size``. Returns ``[E]`` int64 group ids numbered ``0..G-1`` in
        order of ``(env_group, ordinal)``.
    """
    eg = env_groups.to(torch.int64)[layout.env]
    width = int(layout.ordinal.max()) + 1 if layout.num_episodes else 1
    key = eg * width + layout.ordinal
    return torch.unique(key, sorted=True, return_inverse=True)[1]


# ----------------------------------------------------------------------------- GRPO / DAPO


class GroupAdvantages(NamedTuple):
    """GRPO's per-episode advantages and the group statistics behind them (all ``[E]``).

    Attributes:
        advantages: ``(score - group_mean) / (group_std + eps)`` (or without the division when
            ``scale_by_std=False``); ``0`` for invalid episodes and for groups of one.
        group_mean: mean score of the episode's group (over its valid members).
        group_std: unbiased std of the group's scores; ``0`` for a group of one.
        group_size: number of valid episodes in the group.
    """

    advantages: Tensor
    group_mean: Tensor
    group_std: Tensor
    group_size: Tensor


def grpo_advantages(
    scores: Tensor,
    group_ids: Tensor,
    eps: float = 1e-6,
    scale_by_std: bool = True,
    valid: Tensor | None = None,
) -> GroupAdvantages:
    """Group-relative advantages: normalise each episode's score within its group.

    Shapes:
        scores: ``[E]`` (usually undiscounted episode returns); group_ids: ``[E]`` int64
        (any non-negative ids); valid: ``[E]`` bool or ``None``. Returns :class:`GroupAdvantages`.

    ``A_i = (s_i - mean_g) / (std_g + eps)`` with the unbiased (``n - 1``) std over the valid
    members of ``i``'s group ``g`` (``scale_by_std=False`` gives Dr. GRPO's ``s_i - mean_g``).
    A group with a single valid episode has no peer to compare with: its std is taken as 0
    and its advantage is exactly 0 (the episode then contributes no policy gradient).
    Invalid episodes (e.g. unfinished at the rollout's end) get advantage 0 and do not enter
    any group's statistics.
    """
    if scores.dim() != 1 or group_ids.shape != scores.shape:
        raise ValueError(
            f"grpo_advantages expects scores [E] and group_ids [E], got {tuple(scores.shape)} "
            f"and {tuple(group_ids.shape)}"
        )
    dtype, dev = scores.dtype, scores.device
    m = torch.ones_like(scores, dtype=torch.bool) if valid is None else _bool(valid)
    zero = torch.zeros((), dtype=dtype, device=dev)
    s = torch.where(m, scores, zero)
    gid = group_ids.to(torch.int64)
    G = int(gid.max()) + 1 if gid.numel() else 0
    count = torch.zeros(G, dtype=dtype, device=dev).scatter_add(0, gid, m.to(dtype))
    total = torch.zeros(G, dtype=dtype, device=dev).scatter_add(0, gid, s)
    mean = total / count.clamp(min=1)
    centered = torch.where(m, s - mean[gid], zero)
    sq = torch.zeros(G, dtype=dtype, device=dev).scatter_add(0, gid, centered * centered)
    std = torch.where(count > 1, (sq / (count - 1).clamp(min=1)).sqrt(), zero)
    adv = centered / (std[gid] + eps) if scale_by_std else centered
    adv = torch.where(m & (count[gid] > 1), adv, zero)
    return GroupAdvantages(adv, mean[gid], std[gid], count[gid].to(torch.int64))


def dynamic_sampling_mask(
    scores: Tensor, group_ids: Tensor, valid: Tensor | None = None, tol: float = 0.0
) -> Tensor:
    """DAPO's dynamic sampling: keep only groups whose scores are not all equal.

    Shapes:
        scores, group_ids, valid: ``[E]``. Returns ``keep[E]`` bool.

    A group whose valid scores span at most ``tol`` (``max - min <= tol``) has zero
    advantage everywhere and only dilutes the batch, so all its episodes are dropped; so
    is a group with fewer than two valid episodes. Invalid episodes are never kept.
    """
    m = torch.ones_like(scores, dtype=torch.bool) if valid is None else _bool(valid)
    gid = group_ids.to(torch.int64)
    G = int(gid.max()) + 1 if gid.numel() else 0
    inf = torch.tensor(float("inf"), dtype=scores.dtype, device=scores.device)
    hi = torch.full((G,), -inf, dtype=scores.dtype, device=scores.device)
    lo = torch.full((G,), inf, dtype=scores.dtype, device=scores.device)
    hi = hi.scatter_reduce(0, gid, torch.where(m, scores, -inf), reduce="amax")
    lo = lo.scatter_reduce(0, gid, torch.where(m, scores, inf), reduce="amin")
    count = torch.zeros(G, dtype=torch.int64, device=scores.device).scatter_add(0, gid, m.to(torch.int64))
    keep_group = (count > 1) & ((hi - lo) > tol)
    return m & keep_group[gid]


# ----------------------------------------------------------------------------- Reinforce++


def discounted_returns(rewards: Tensor, dones: Tensor, gamma: float) -> Tensor:
    """Discounted returns-to-go within each episode, with no bootstrap (no critic).

    Shapes:
        rewards, dones: ``[T, N]``. Returns ``[T, N]``.

    ``G_t = r_t + gamma * G_{t+1}``, cut at every done; at the rollout's end ``G_{T-1} = r_{T-1}``
    (an unfinished episode's tail is simply missing: mask it out if that bias matters).
    """
    if rewards.dim() != 2 or dones.shape != rewards.shape:
        raise ValueError(
            f"discounted_returns expects rewards and dones of shape [T, N], got {tuple(rewards.shape)} "
            f"and {tuple(dones.shape)}"
        )
    cont = gamma * (~_bool(dones)).to(rewards.dtype)
    out = torch.empty_like(rewards)
    last = torch.zeros_like(rewards[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        last = rewards[t] + cont[t] * last
        out[t] = last
    return out


def reinforce_pp_advantages(
    rewards: Tensor, dones: Tensor, gamma: float, mask: Tensor | None = None, eps: float = 1e-8
) -> tuple[Tensor, Tensor]:
    """Reinforce++: discounted returns-to-go minus a global, batch-normalised baseline.

    Shapes:
        rewards, dones, mask: ``[T, N]``. Returns ``(advantages[T, N], returns[T, N])``.

    ``A_t = (G_t - mean(G)) / (std(G) + eps)`` where mean and (unbiased) std run over *all*
    valid steps of the batch, not per group: the baseline needs no peers, so it is well
    defined for any group size, including 1. Invalid steps get advantage 0.
    """
    returns = discounted_returns(rewards, dones, gamma)
    return normalize_advantages(returns, mask, eps=eps), returns


# ----------------------------------------------------------------------------- losses


def aggregate_loss(
    per_step: Tensor,
    mask: Tensor | None = None,
    mode: str = "step-mean",
    episode_ids: Tensor | None = None,
) -> Tensor:
    """Reduce per-step loss terms to a scalar.

    Shapes:
        per_step: ``[*B]``; mask: ``[*B]`` or ``None``; episode_ids: ``[*B]`` int64 (needed for
        ``"episode-mean"``). Returns a scalar.

    ``"step-mean"``: the mean over all valid steps of the batch (DAPO's token-level mean:
    long episodes weigh in proportion to their length). ``"episode-mean"``: the mean over
    episodes of each episode's mean over its valid steps (GRPO's sequence mean: every
    episode weighs the same). Invalid entries never contribute, even if ``nan``.
    """
    if mode == "step-mean":
        return masked_mean(per_step, mask)
    if mode != "episode-mean":
        raise ValueError(f"aggregate_loss: mode {mode!r} is not one of {AGGREGATIONS}")
    if episode_ids is None:
        raise ValueError("aggregate_loss: mode 'episode-mean' needs episode_ids")
    m = torch.ones_like(per_step, dtype=torch.bool) if mask is None else _bool(mask).expand_as(per_step)
    zero = torch.zeros((), dtype=per_step.dtype, device=per_step.device)
    x = torch.where(m, per_step, zero).reshape(-1)
    ids = episode_ids.reshape(-1).to(torch.int64)
    mf = m.reshape(-1).to(per_step.dtype)
    E = int(ids.max()) + 1 if ids.numel() else 0
    sums = torch.zeros(E, dtype=per_step.dtype, device=per_step.device).index_add(0, ids, x)
    counts = torch.zeros(E, dtype=per_step.dtype, device=per_step.device).index_add(0, ids, mf)
    present = counts > 0
    per_episode = sums / counts.clamp(min=1)
    return masked_mean(per_episode, present)


def clipped_surrogate_loss(
    new_logprob: Tensor,
    old_logprob: Tensor,
    advantages: Tensor,
    clip_eps_low: float,
    clip_eps_high: float | None = None,
    mask: Tensor | None = None,
    episode_ids: Tensor | None = None,
    aggregation: str = "step-mean",
) -> PolicyLossTerms:
    """The clipped surrogate with asymmetric clipping and a choice of aggregation (GRPO / DAPO).

    Shapes:
        new_logprob, old_logprob, advantages, mask, episode_ids: ``[*B]``.
        Returns :class:`.functional.PolicyLossTerms` of scalars.

    Per step: ``-min(ratio * A, clip(ratio, 1 - clip_eps_low, 1 + clip_eps_high) * A)``,
    ``clip_eps_high`` defaulting to ``clip_eps_low``; DAPO's clip-higher uses e.g. 0.2/0.28.
    The per-step terms are reduced by :func:`aggregate_loss` (``"step-mean"`` equals
    :func:`.functional.ppo_policy_loss`). Diagnostics are step-means over valid entries.
    """
    high = clip_eps_low if clip_eps_high is None else clip_eps_high
    logratio = new_logprob - old_logprob
    m = None
    if mask is not None:
        m = _bool(mask).expand_as(logratio)
        zero = torch.zeros((), dtype=logratio.dtype, device=logratio.device)
        logratio = torch.where(m, logratio, zero)
        advantages = torch.where(m, advantages, zero.to(advantages.dtype))
    ratio = logratio.exp()
    per_step = -torch.minimum(ratio * advantages, ratio.clamp(1.0 - clip_eps_low, 1.0 + high) * advantages)
    loss = aggregate_loss(per_step, m, aggregation, episode_ids)
    with torch.no_grad():
        approx_kl = masked_mean((ratio - 1.0) - logratio, m)
        outside = ((ratio < 1.0 - clip_eps_low) | (ratio > 1.0 + high)).to(ratio.dtype)
        clip_fraction = masked_mean(outside, m)
        ratio_mean = masked_mean(ratio, m)
    return PolicyLossTerms(loss, approx_kl, clip_fraction, ratio_mean)

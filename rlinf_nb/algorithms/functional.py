"""Pure PPO maths: advantage estimation and loss terms, as plain torch functions.

Every function here is stateless and side-effect free; it takes tensors and returns
tensors, so it can be unit-tested against slow reference loops and reused by any
runtime (single process, Ray workers, notebooks).

Shape conventions (stated again in each docstring):

* ``T`` = time steps of a rollout, ``N`` = parallel environments, ``B`` = any batch
  shape (for example ``[T, N]`` or a flattened minibatch ``[M]``).
* A ``mask`` is a bool (or 0/1) tensor of the same shape as the values it masks;
  ``True``/nonzero marks a *valid* entry. Masked means are over valid entries only,
  and invalid entries never influence a result, even if they hold ``nan`` or ``inf``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "PolicyLossTerms",
    "entropy_bonus",
    "gae",
    "masked_mean",
    "normalize_advantages",
    "ppo_policy_loss",
    "value_loss",
]


def _as_bool_mask(mask: Tensor, like: Tensor) -> Tensor:
    if mask.dtype != torch.bool:
        mask = mask != 0
    return mask.expand_as(like)


def masked_mean(x: Tensor, mask: Tensor | None = None) -> Tensor:
    """Mean of ``x`` over its valid entries.

    Shapes:
        x: ``[*B]``; mask: ``[*B]`` (bool or 0/1; broadcastable to ``x``) or ``None``.
        Returns a scalar (0-dim) tensor.

    With ``mask=None`` this is ``x.mean()``. With a mask, only entries where the mask is
    true/nonzero count: their values are summed and divided by their number. Invalid
    entries are replaced by zero *before* summing (``torch.where``), so ``nan``/``inf``
    there cannot leak into the result or its gradient. If no entry is valid the result
    is ``0`` (not ``nan``).
    """
    if mask is None:
        return x.mean()
    m = _as_bool_mask(mask, x)
    total = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum()
    count = m.sum().clamp(min=1)
    return total / count


def gae(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    truncated: Tensor | None,
    last_values: Tensor,
    bootstrap_values: Tensor | None = None,
    gamma: float = 0.99,
    lam: float = 0.95,
) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation with correct time-limit bootstrapping.

    Shapes:
        rewards, values, dones, truncated: ``[T, N]``
        last_values: ``[N]``
        bootstrap_values: ``[T, N]`` or ``None``
        Returns ``(advantages[T, N], returns[T, N])`` with ``returns = advantages + values``.

    Semantics, for step ``t`` of env ``n``:

    * ``values[t]`` = V(s_t), the value of the observation the action was taken in.
    * ``dones[t]`` = the episode ended at step ``t`` (terminated OR truncated).
    * ``truncated[t]`` = it ended because of a time limit (a truncated step counts as
      done even if ``dones[t]`` is false). ``None`` means no truncations.
    * ``bootstrap_values[t]`` = V(final observation of the episode that ended at ``t``);
      read only where ``truncated[t]``. With ``None`` truncated steps bootstrap from 0,
      i.e. they are treated like terminations (biased, but well defined).
    * ``last_values`` = V(s_T), the observation after step ``T-1``; used only for envs
      whose step ``T-1`` did not end.

    The TD error is ``delta_t = r_t + gamma * V_next - V(s_t)`` where ``V_next`` is
    ``values[t+1]`` (or ``last_values``) when the episode continues, ``bootstrap_values[t]``
    when it was truncated and ``0`` when it terminated. The advantage recursion
    ``A_t = delta_t + gamma * lam * A_{t+1}`` is cut at every episode end, truncated or
    not: the next row belongs to a new episode.

    Vectorised over ``N``, with a single reverse Python loop over ``T``. Inputs are
    usually detached rollout data; if they require grad the result is differentiable.
    ``dones``/``truncated`` may be bool or 0/1 of any dtype.
    """
    if rewards.dim() != 2:
        raise ValueError(f"gae expects rewards of shape [T, N], got {tuple(rewards.shape)}")
    T, N = rewards.shape
    for name, tensor in (("values", values), ("dones", dones)):
        if tensor.shape != rewards.shape:
            raise ValueError(f"gae: {name} has shape {tuple(tensor.shape)}, expected {(T, N)}")
    if last_values.shape != (N,):
        raise ValueError(f"gae: last_values has shape {tuple(last_values.shape)}, expected {(N,)}")
    dtype = values.dtype
    done = dones.bool() if dones.dtype != torch.bool else dones
    zero = torch.zeros((), dtype=dtype, device=values.device)
    next_values = torch.cat([values[1:], last_values.unsqueeze(0)], dim=0)
    if truncated is not None:
        if truncated.shape != rewards.shape:
            raise ValueError(f"gae: truncated has shape {tuple(truncated.shape)}, expected {(T, N)}")
        trunc = truncated.bool() if truncated.dtype != torch.bool else truncated
        done = done | trunc
        if bootstrap_values is not None:
            if bootstrap_values.shape != rewards.shape:
                raise ValueError(
                    f"gae: bootstrap_values has shape {tuple(bootstrap_values.shape)}, expected {(T, N)}"
                )
            next_values = torch.where(trunc, bootstrap_values.to(dtype), next_values)
            done_no_bootstrap = done & ~trunc
        else:
            done_no_bootstrap = done
    else:
        done_no_bootstrap = done
    next_values = torch.where(done_no_bootstrap, zero, next_values)
    deltas = rewards.to(dtype) + gamma * next_values - values
    # Continuation factor of the GAE chain: 0 across any episode boundary.
    carry = (gamma * lam) * (~done).to(dtype)
    advantages = torch.empty_like(deltas)
    last = torch.zeros(N, dtype=dtype, device=values.device)
    for t in range(T - 1, -1, -1):
        last = deltas[t] + carry[t] * last
        advantages[t] = last
    return advantages, advantages + values


def normalize_advantages(adv: Tensor, mask: Tensor | None = None, eps: float = 1e-8) -> Tensor:
    """Standardise advantages to zero mean and unit std over the valid entries.

    Shapes:
        adv: ``[*B]``; mask: ``[*B]`` or ``None``. Returns ``[*B]``.

    Uses the unbiased (``n - 1``) standard deviation, like ``Tensor.std()`` in CleanRL and
    SB3: ``(adv - mean) / (std + eps)``. Invalid entries come back as ``0``. With a single
    valid entry the std is taken as 0 and the result is 0.
    """
    if mask is None:
        mean = adv.mean()
        centered = adv - mean
        n = adv.numel()
        var = centered.pow(2).sum() / max(n - 1, 1)
        return centered / (var.sqrt() + eps)
    m = _as_bool_mask(mask, adv)
    zero = torch.zeros((), dtype=adv.dtype, device=adv.device)
    mean = masked_mean(adv, m)
    centered = torch.where(m, adv - mean, zero)
    n = m.sum()
    var = centered.pow(2).sum() / (n - 1).clamp(min=1)
    return centered / (var.sqrt() + eps)


class PolicyLossTerms(NamedTuple):
    """The clipped-surrogate loss and its (detached) diagnostics.

    Attributes:
        loss: scalar to minimise (the negated clipped surrogate); carries gradients.
        approx_kl: ``mean((ratio - 1) - log(ratio))``, the low-variance k3 estimator of
            KL(old || new) (CleanRL / Schulman's blog); detached.
        clip_fraction: share of valid entries whose ratio lies outside the clip range; detached.
        ratio_mean: mean probability ratio ``new / old``; detached.
    """

    loss: Tensor
    approx_kl: Tensor
    clip_fraction: Tensor
    ratio_mean: Tensor


def ppo_policy_loss(
    new_logprob: Tensor,
    old_logprob: Tensor,
    advantages: Tensor,
    clip_eps: float,
    mask: Tensor | None = None,
    clip_eps_high: float | None = None,
) -> PolicyLossTerms:
    """PPO's clipped surrogate objective, negated to be minimised.

    Shapes:
        new_logprob, old_logprob, advantages: ``[*B]`` (log-probs of the whole action,
        i.e. already summed over action dimensions); mask: ``[*B]`` or ``None``.
        Returns :class:`PolicyLossTerms` of scalars.

    ``ratio = exp(new_logprob - old_logprob)`` and
    ``loss = -mean(min(ratio * A, clip(ratio, 1 - clip_eps, 1 + clip_eps_high) * A))``
    over valid entries. ``clip_eps_high`` (default ``clip_eps``) allows DAPO's asymmetric
    "clip-higher". Advantages are used as given (normalise them beforehand if wanted);
    ``old_logprob`` and ``advantages`` should be detached. Masked entries get a log-ratio
    of 0 before the ``exp``, so garbage there gives neither ``nan`` loss nor ``nan`` grads.
    """
    high = clip_eps if clip_eps_high is None else clip_eps_high
    logratio = new_logprob - old_logprob
    if mask is not None:
        m = _as_bool_mask(mask, logratio)
        logratio = torch.where(m, logratio, torch.zeros((), dtype=logratio.dtype, device=logratio.device))
        advantages = torch.where(
            m, advantages, torch.zeros((), dtype=advantages.dtype, device=advantages.device)
        )
    else:
        m = None
    ratio = logratio.exp()
    surr_unclipped = ratio * advantages
    surr_clipped = ratio.clamp(1.0 - clip_eps, 1.0 + high) * advantages
    loss = -masked_mean(torch.minimum(surr_unclipped, surr_clipped), m)
    with torch.no_grad():
        approx_kl = masked_mean((ratio - 1.0) - logratio, m)
        outside = ((ratio < 1.0 - clip_eps) | (ratio > 1.0 + high)).to(ratio.dtype)
        clip_fraction = masked_mean(outside, m)
        ratio_mean = masked_mean(ratio, m)
    return PolicyLossTerms(loss, approx_kl.detach(), clip_fraction.detach(), ratio_mean.detach())


def value_loss(
    new_values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    clip_eps: float | None = None,
    mask: Tensor | None = None,
) -> Tensor:
    """Half mean squared error of the value function, optionally clipped (PPO2 / CleanRL).

    Shapes:
        new_values, old_values, returns: ``[*B]``; mask: ``[*B]`` or ``None``. Returns a scalar.

    Without clipping: ``0.5 * mean((V - R)^2)``. With ``clip_eps``:
    ``V_clip = V_old + clip(V - V_old, -clip_eps, clip_eps)`` and
    ``0.5 * mean(max((V - R)^2, (V_clip - R)^2))`` (pessimistic, as in OpenAI baselines).
    ``old_values`` and ``returns`` should be detached.
    """
    if mask is not None:
        # Zero the inputs of invalid entries so garbage there cannot produce nan gradients.
        m = _as_bool_mask(mask, new_values)
        zero = torch.zeros((), dtype=new_values.dtype, device=new_values.device)
        new_values = torch.where(m, new_values, zero)
        old_values = torch.where(m, old_values, zero)
        returns = torch.where(m, returns, zero)
        mask = m
    err = new_values - returns
    sq = err * err
    if clip_eps is not None:
        clipped = old_values + (new_values - old_values).clamp(-clip_eps, clip_eps)
        sq_clipped = (clipped - returns).pow(2)
        sq = torch.maximum(sq, sq_clipped)
    return 0.5 * masked_mean(sq, mask)


def entropy_bonus(entropy: Tensor, mask: Tensor | None = None) -> Tensor:
    """Mean policy entropy over the valid entries (a *bonus*: subtract ``coef * it`` from the loss).

    Shapes:
        entropy: ``[*B]``; mask: ``[*B]`` or ``None``. Returns a scalar.
    """
    return masked_mean(entropy, mask)

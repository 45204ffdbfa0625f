"""The actor-critic API every policy offers (what PPO, the rollout workers and SAC call).

A policy subclasses :class:`ActorCriticAPI` and implements :meth:`distribution`,
:meth:`value` and :meth:`_dist_and_value` (one pass for both, sharing work where the
network shares layers); ``act``, ``act_without_value``, ``evaluate`` and ``sample`` follow from them.

Shapes: ``N`` = batch. ``obs`` is ``[N, *obs_shape]`` (a tensor) or, for dict
observation spaces, a dict of such tensors. Actions are ``[N]`` (Discrete) or ``[N, A]``
(Box); with ``chunk = k > 1`` they are ``[N, k]`` / ``[N, k, A]``. Log-probs, entropies
and values are always ``[N]``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from rlinf_nb.policies.distributions import ActionDistribution

__all__ = ["ActorCriticAPI"]


class ActorCriticAPI(nn.Module):
    """``act`` / ``evaluate`` / ``sample`` on top of a distribution and a value function."""

    def distribution(self, obs: Any) -> ActionDistribution:
        """The action distribution for ``obs``."""
        raise NotImplementedError

    def value(self, obs: Any) -> Tensor:
        """State values ``[N]``."""
        raise NotImplementedError

    def _dist_and_value(self, obs: Any) -> tuple[ActionDistribution, Tensor]:
        return self.distribution(obs), self.value(obs)

    @torch.no_grad()
    def act(self, obs: Any, deterministic: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """Rollout step (no gradients): ``obs -> (action, logprob[N], value[N])``.

        Gaussian actions are not clipped to the space's bounds (clip in the env runner and
        store the unclipped action); squashed-Gaussian actions are within bounds.
        """
        dist, value = self._dist_and_value(obs)
        action = dist.mode() if deterministic else dist.sample()
        return action, dist.log_prob(action), value

    @torch.no_grad()
    def act_without_value(self, obs: Any, deterministic: bool = False) -> tuple[Tensor, Tensor]:
        """:meth:`act` without the critic: ``obs -> (action, logprob[N])`` (off-policy collection,
        whose learner has critics of its own, needs no state value)."""
        dist = self.distribution(obs)
        action = dist.mode() if deterministic else dist.sample()
        return action, dist.log_prob(action)

    def evaluate(self, obs: Any, action: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Training step: ``(obs, action) -> (logprob[N], entropy[N], value[N])`` with gradients."""
        dist, value = self._dist_and_value(obs)
        return dist.log_prob(action), dist.entropy(), value

    def sample(self, obs: Any, deterministic: bool = False) -> tuple[Tensor, Tensor]:
        """Reparameterised ``(action, logprob[N])`` with gradients (SAC's actor update).

        Not available for the categorical head.
        """
        dist = self.distribution(obs)
        if deterministic:
            action = dist.mode()
            return action, dist.log_prob(action)
        return dist.rsample_with_log_prob()

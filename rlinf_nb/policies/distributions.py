"""Action distributions and the policy heads that produce them.

Small, allocation-light stand-ins for ``torch.distributions`` with the one interface the
algorithms need. Shapes: ``N`` = batch, ``A`` = action dimensions, ``K`` = discrete choices.

* :class:`Categorical` -- ``Discrete`` actions ``[N]`` (int64).
* :class:`DiagGaussian` -- ``Box`` actions ``[N, A]``, unbounded (clip in the env runner).
* :class:`SquashedGaussian` -- ``Box`` actions ``[N, A]`` squashed by ``tanh`` into the
  space's bounds, with the change-of-variables log-prob correction (SAC).

``log_prob`` and ``entropy`` always return ``[N]``: per-dimension terms are summed.

Action chunks: :class:`Chunked` wraps any of them so that one sample is ``chunk`` actions,
``[N, chunk]`` (Discrete) or ``[N, chunk, A]`` (Box), with ``log_prob`` / ``entropy`` the
sums over the chunk, still ``[N]``. :func:`make_action_head` builds the head for an action
space, a head name (``"auto"``, ``"categorical"``, ``"gaussian"``, ``"squashed_gaussian"``)
and a chunk length.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlinf_nb.policies.spec import ACTION_HEADS, resolve_head_kind

__all__ = [
    "ACTION_HEADS",
    "ActionDistribution",
    "Categorical",
    "CategoricalHead",
    "Chunked",
    "ChunkedHead",
    "DiagGaussian",
    "GaussianHead",
    "SquashedGaussian",
    "SquashedGaussianHead",
    "layer_init",
    "make_action_head",
    "resolve_head_kind",
]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_LOG2 = math.log(2.0)


def layer_init(layer: nn.Linear, gain: float = math.sqrt(2.0), bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights with ``gain`` and constant bias (CleanRL / SB3 ``ortho_init``)."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


class ActionDistribution(Protocol):
    """What every action distribution offers."""

    def sample(self) -> Tensor:
        """An action ``[N]`` or ``[N, A]``, no gradient."""
        ...

    def log_prob(self, action: Tensor) -> Tensor:
        """Log-probability (density) of ``action``, ``[N]``."""
        ...

    def entropy(self) -> Tensor:
        """Entropy, ``[N]`` (a one-sample estimate where there is no closed form)."""
        ...

    def mode(self) -> Tensor:
        """The deterministic action (argmax / mean / squashed mean)."""
        ...


class Categorical:
    """Categorical over ``K`` choices from unnormalised ``logits[N, K]``.

    Sampling uses the Gumbel-max trick on the raw logits (no softmax needed); the
    normalised log-probabilities are computed on first use and cached.
    """

    def __init__(self, logits: Tensor):
        self.raw_logits = logits
        self._logits: Tensor | None = None

    @property
    def logits(self) -> Tensor:
        """Normalised log-probabilities ``[N, K]``."""
        if self._logits is None:
            self._logits = torch.log_softmax(self.raw_logits, dim=-1)
        return self._logits

    @property
    def probs(self) -> Tensor:
        return self.logits.exp()

    def sample(self) -> Tensor:
        with torch.no_grad():
            # argmax(logits + Gumbel noise), with Gumbel = -log(Exponential(1)).
            noise = torch.empty_like(self.raw_logits).exponential_().log_()
            return (self.raw_logits - noise).argmax(-1)

    def log_prob(self, action: Tensor) -> Tensor:
        return self.logits.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> Tensor:
        logits = self.logits
        return -(logits.exp() * logits).sum(-1)

    def mode(self) -> Tensor:
        return self.raw_logits.argmax(-1)

    def rsample_with_log_prob(self) -> tuple[Tensor, Tensor]:
        raise NotImplementedError("a categorical distribution has no reparameterised sample")


class DiagGaussian:
    """Independent Gaussians: ``mean[N, A]``, ``log_std`` broadcastable to it."""

    def __init__(self, mean: Tensor, log_std: Tensor):
        self.mean = mean
        self.log_std = log_std.expand_as(mean)

    @property
    def std(self) -> Tensor:
        return self.log_std.exp()

    def rsample(self) -> Tensor:
        return self.mean + self.std * torch.randn_like(self.mean)

    def sample(self) -> Tensor:
        with torch.no_grad():
            return self.rsample()

    def log_prob(self, action: Tensor) -> Tensor:
        z = (action - self.mean) * torch.exp(-self.log_std)
        return (-0.5 * z * z - self.log_std - _HALF_LOG_2PI).sum(-1)

    def entropy(self) -> Tensor:
        return (0.5 + _HALF_LOG_2PI + self.log_std).sum(-1)

    def mode(self) -> Tensor:
        return self.mean

    def rsample_with_log_prob(self) -> tuple[Tensor, Tensor]:
        action = self.rsample()
        return action, self.log_prob(action)


class SquashedGaussian:
    """``action = loc + scale * tanh(u)``, ``u ~ N(mean, exp(log_std))`` (SAC's policy).

    ``log p(action) = log N(u) - sum(log(scale) + log(1 - tanh(u)^2))``, with the stable
    form ``log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u))``. ``log_prob`` of a given
    action inverts the squash with ``atanh`` (clamped just inside the bounds); prefer
    :meth:`rsample_with_log_prob`, which uses the pre-squash sample directly.
    """

    def __init__(self, mean: Tensor, log_std: Tensor, loc: Tensor | float = 0.0, scale: Tensor | float = 1.0):
        self.base = DiagGaussian(mean, log_std)
        self.loc = loc
        self.scale = scale
        self._log_scale_sum = (
            torch.log(torch.as_tensor(scale, dtype=mean.dtype, device=mean.device))
            .expand(mean.shape[-1:])
            .sum()
        )

    def _log_prob_pre_squash(self, u: Tensor) -> Tensor:
        log_det = (2.0 * (_LOG2 - u - F.softplus(-2.0 * u))).sum(-1) + self._log_scale_sum
        return self.base.log_prob(u) - log_det

    def rsample_with_log_prob(self) -> tuple[Tensor, Tensor]:
        u = self.base.rsample()
        return self.loc + self.scale * torch.tanh(u), self._log_prob_pre_squash(u)

    def sample(self) -> Tensor:
        with torch.no_grad():
            return self.rsample_with_log_prob()[0]

    def log_prob(self, action: Tensor) -> Tensor:
        eps = torch.finfo(action.dtype).eps
        y = ((action - self.loc) / self.scale).clamp(-1.0 + eps, 1.0 - eps)
        return self._log_prob_pre_squash(torch.atanh(y))

    def entropy(self) -> Tensor:
        """One-sample Monte-Carlo estimate ``-log p(a)``, ``a ~ pi`` (no closed form)."""
        return -self.rsample_with_log_prob()[1]

    def mode(self) -> Tensor:
        return self.loc + self.scale * torch.tanh(self.base.mean)


# ----------------------------------------------------------------------------- heads


class CategoricalHead(nn.Module):
    """``features[N, F] -> Categorical(logits[N, K])``."""

    def __init__(self, in_dim: int, n: int, gain: float = 0.01):
        super().__init__()
        self.logits = layer_init(nn.Linear(in_dim, n), gain)

    def forward(self, features: Tensor) -> Categorical:
        return Categorical(self.logits(features))


class GaussianHead(nn.Module):
    """``features[N, F] -> DiagGaussian(mean[N, A], log_std[A])``; ``log_std`` is a free parameter."""

    def __init__(self, in_dim: int, action_dim: int, log_std_init: float = 0.0, gain: float = 0.01):
        super().__init__()
        self.mean = layer_init(nn.Linear(in_dim, action_dim), gain)
        self.log_std = nn.Parameter(torch.full((action_dim,), float(log_std_init)))

    def forward(self, features: Tensor) -> DiagGaussian:
        return DiagGaussian(self.mean(features), self.log_std)


class SquashedGaussianHead(nn.Module):
    """``features[N, F] -> SquashedGaussian`` with a state-dependent ``log_std``.

    ``log_std = log_std_min + (tanh(raw) + 1) / 2 * (log_std_max - log_std_min)`` (CleanRL SAC),
    actions are mapped into ``[low, high]`` when both are finite, else into ``[-1, 1]``.
    """

    def __init__(
        self,
        in_dim: int,
        action_dim: int,
        low: np.ndarray | None = None,
        high: np.ndarray | None = None,
        log_std_min: float = -5.0,
        log_std_max: float = 2.0,
        gain: float = 0.01,
    ):
        super().__init__()
        self.mean = layer_init(nn.Linear(in_dim, action_dim), gain)
        self.log_std = layer_init(nn.Linear(in_dim, action_dim), gain)
        self.log_std_min = float(log_std_min)
        self.log_std_max = float(log_std_max)
        if low is not None and high is not None and np.all(np.isfinite(low)) and np.all(np.isfinite(high)):
            low_t = torch.as_tensor(np.asarray(low, dtype=np.float32).reshape(-1))
            high_t = torch.as_tensor(np.asarray(high, dtype=np.float32).reshape(-1))
            loc, scale = (high_t + low_t) / 2.0, (high_t - low_t) / 2.0
        else:
            loc, scale = torch.zeros(action_dim), torch.ones(action_dim)
        self.register_buffer("action_loc", loc)
        self.register_buffer("action_scale", scale)

    def forward(self, features: Tensor) -> SquashedGaussian:
        raw = torch.tanh(self.log_std(features))
        log_std = self.log_std_min + 0.5 * (raw + 1.0) * (self.log_std_max - self.log_std_min)
        return SquashedGaussian(self.mean(features), log_std, self.action_loc, self.action_scale)


# ----------------------------------------------------------------------------- chunks


class Chunked:
    """``chunk`` actions per sample from a distribution over their concatenation.

    ``base`` is a distribution over ``[N, chunk * A]`` (Gaussian kinds) or a
    :class:`Categorical` over ``logits[N, chunk, K]``; actions come out as
    ``[N, chunk, A]`` / ``[N, chunk]``; ``log_prob`` and ``entropy`` are ``[N]`` (the
    chunk's actions are independent given the observation, so their terms add up).
    """

    def __init__(self, base: Any, chunk: int, action_shape: tuple[int, ...]):
        self.base = base
        self.chunk = chunk
        self.action_shape = tuple(action_shape)  # () for Discrete, (A,) for Box
        self._discrete = isinstance(base, Categorical)

    def _out(self, flat: Tensor) -> Tensor:
        if self._discrete:
            return flat  # already [N, chunk]
        return flat.reshape(flat.shape[0], self.chunk, *self.action_shape)

    def _in(self, action: Tensor) -> Tensor:
        if self._discrete:
            return action.reshape(action.shape[0], self.chunk)
        return action.reshape(action.shape[0], -1)

    def _sum(self, x: Tensor) -> Tensor:
        return x.sum(-1) if self._discrete else x

    def sample(self) -> Tensor:
        return self._out(self.base.sample())

    def log_prob(self, action: Tensor) -> Tensor:
        return self._sum(self.base.log_prob(self._in(action)))

    def entropy(self) -> Tensor:
        return self._sum(self.base.entropy())

    def mode(self) -> Tensor:
        return self._out(self.base.mode())

    def rsample_with_log_prob(self) -> tuple[Tensor, Tensor]:
        action, logp = self.base.rsample_with_log_prob()
        return self._out(action), self._sum(logp)


class ChunkedHead(nn.Module):
    """Wraps a head whose outputs cover ``chunk`` actions; returns :class:`Chunked`."""

    def __init__(self, head: nn.Module, chunk: int, action_shape: tuple[int, ...], discrete: bool):
        super().__init__()
        self.head = head
        self.chunk = chunk
        self.action_shape = tuple(action_shape)
        self.discrete = discrete

    def forward(self, features: Tensor) -> Chunked:
        if self.discrete:
            logits = self.head.logits(features)  # [N, chunk * K]
            base: Any = Categorical(logits.reshape(logits.shape[0], self.chunk, -1))
        else:
            base = self.head(features)
        return Chunked(base, self.chunk, self.action_shape)


def make_action_head(
    kind: str,
    action_space: gym.Space,
    in_dim: int,
    *,
    chunk: int = 1,
    log_std_init: float = 0.0,
    log_std_min: float = -5.0,
    log_std_max: float = 2.0,
    gain: float = 0.01,
) -> tuple[nn.Module, str]:
    """The action head for ``action_space``: ``(module, resolved kind)``.

    ``module(features[N, in_dim])`` returns the distribution; with ``chunk > 1`` a
    :class:`Chunked` one (a :class:`ChunkedHead` around a head sized for ``chunk`` actions).
    """
    if chunk < 1:
        raise ValueError(f"chunk: got {chunk}; must be >= 1")
    kind = resolve_head_kind(kind, action_space)
    if kind == "categorical":
        head: nn.Module = CategoricalHead(in_dim, int(action_space.n) * chunk, gain=gain)
        action_shape: tuple[int, ...] = ()
    else:
        action_shape = tuple(action_space.shape)
        act_dim = int(np.prod(action_shape)) * chunk
        if kind == "gaussian":
            head = GaussianHead(in_dim, act_dim, log_std_init, gain=gain)
        else:
            low, high = np.asarray(action_space.low).reshape(-1), np.asarray(action_space.high).reshape(-1)
            head = SquashedGaussianHead(
                in_dim, act_dim, low=np.tile(low, chunk), high=np.tile(high, chunk),
                log_std_min=log_std_min, log_std_max=log_std_max, gain=gain,
            )  # fmt: skip
    if chunk > 1:
        head = ChunkedHead(head, chunk, action_shape, discrete=kind == "categorical")
    return head, kind

"""Critic networks for the off-policy family: an ensemble of Q(s, a) MLPs evaluated in one pass.

The ``E`` critics of an ensemble (SAC's twin Q: ``E = 2``; RLPD: ``E = 10``) share no
parameters but run as one batched matmul per layer (:class:`EnsembleLinear`), which on a
CPU is much cheaper than ``E`` separate small networks.

Normalisation per hidden layer (``norm``):

* ``"none"``: ``Linear -> ReLU`` (SAC).
* ``"layer"``: ``Linear -> LayerNorm -> ReLU`` (RLPD), with each critic's own affine.
* ``"batch"``: ``BatchNorm`` on the input, then ``Linear -> BatchNorm -> ReLU`` (CrossQ).
  Each critic keeps its own statistics. In ``train()`` mode the statistics come from the
  batch passed in, so CrossQ feeds ``(s, a)`` and ``(s', a')`` through together.

Shapes: ``obs[B, O]`` (flattened), ``action[B, A]`` -> ``q[E, B]``.

Dict observations (camera images + state): :class:`EncodedEnsembleQ` puts an
:class:`ObsEncoder` (one conv encoder per image key, the state keys flattened) in front of
an :class:`EnsembleQ`. The encoder belongs to the critic and the critic loss trains it; all
``E`` members read the same features (DrQ / RLPD / SERL). Its target copy is Polyak-averaged
with the rest of the critic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["NORMS", "EncodedEnsembleQ", "EnsembleLinear", "EnsembleQ", "ObsEncoder", "copy_params",
           "polyak_update"]  # fmt: skip

NORMS = ("none", "layer", "batch")


class EnsembleLinear(nn.Module):
    """``E`` independent linear layers: ``x[E, B, in] -> x @ W[e] + b[e]``, ``[E, B, out]``.

    Initialised like ``nn.Linear`` (uniform in ``+-1/sqrt(in)``), independently per member.
    """

    def __init__(self, num_members: int, in_features: int, out_features: int):
        super().__init__()
        bound = 1.0 / math.sqrt(in_features)
        self.weight = nn.Parameter(
            torch.empty(num_members, in_features, out_features).uniform_(-bound, bound)
        )
        self.bias = nn.Parameter(torch.empty(num_members, 1, out_features).uniform_(-bound, bound))

    def forward(self, x: Tensor) -> Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


class _EnsembleLayerNorm(nn.Module):
    """LayerNorm over the last dim with a separate affine per ensemble member."""

    def __init__(self, num_members: int, features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_members, 1, features))
        self.bias = nn.Parameter(torch.zeros(num_members, 1, features))

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.layer_norm(x, x.shape[-1:]) * self.weight + self.bias


class _EnsembleBatchNorm(nn.Module):
    """BatchNorm over the batch dim with separate statistics and affine per ensemble member."""

    def __init__(self, num_members: int, features: int, momentum: float, eps: float = 1e-5):
        super().__init__()
        self.bn = nn.BatchNorm1d(num_members * features, momentum=momentum, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        E, B, H = x.shape
        y = self.bn(x.transpose(0, 1).reshape(B, E * H))
        return y.reshape(B, E, H).transpose(0, 1)


class EnsembleQ(nn.Module):
    """``E`` Q-networks ``Q_e(s, a)``, evaluated together.

    Args:
        obs_dim, action_dim: flat sizes of observations and actions.
        hidden_sizes: widths of the hidden layers.
        num_critics: ``E``.
        norm: ``"none"``, ``"layer"`` or ``"batch"`` (see the module docstring).
        bn_momentum: PyTorch-style running-statistics momentum of the batch norms
            (``0.01`` = the paper's ``0.99`` decay).
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        hidden_sizes: Iterable[int] = (256, 256),
        num_critics: int = 2,
        norm: str = "none",
        bn_momentum: float = 0.01,
    ):
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"EnsembleQ: norm {norm!r} is not one of {NORMS}")
        sizes = [int(s) for s in hidden_sizes]
        self.num_critics = int(num_critics)
        self.norm = norm
        E = self.num_critics
        in_dim = obs_dim + action_dim
        layers: list[nn.Module] = []
        if norm == "batch":
            layers.append(_EnsembleBatchNorm(E, in_dim, bn_momentum))
        for width in sizes:
            layers.append(EnsembleLinear(E, in_dim, width))
            if norm == "layer":
                layers.append(_EnsembleLayerNorm(E, width))
            elif norm == "batch":
                layers.append(_EnsembleBatchNorm(E, width, bn_momentum))
            layers.append(nn.ReLU())
            in_dim = width
        layers.append(EnsembleLinear(E, in_dim, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, obs: Tensor, action: Tensor) -> Tensor:
        """``obs[B, ...]``, ``action[B, A]`` -> ``q[E, B]``."""
        B = obs.shape[0]
        x = torch.cat([obs.reshape(B, -1), action.reshape(B, -1)], dim=-1).to(self.net[-1].weight.dtype)
        x = x.unsqueeze(0).expand(self.num_critics, B, x.shape[-1])
        return self.net(x).squeeze(-1)


class ObsEncoder(nn.Module):
    """A dict observation -> one feature vector: ``cat(enc_k(obs[k]) for image keys, flat state keys)``.

    Args:
        encoders: one module per image key, ``image[B, ...] -> features[B, F_k]`` with an
            ``out_dim`` attribute (e.g. the ``cnn`` policy's ``ImageEncoder``: uint8 is scaled
            to ``[0, 1]`` inside it).
        state_keys: keys flattened and appended as they are.
        state_dim: their total flat size.

    Shapes: ``obs = {key: [B, ...]}`` (or one image ``[B, ...]``) -> ``[B, sum F_k + state_dim]``.
    """

    def __init__(self, encoders: Mapping[str, nn.Module], state_keys: Iterable[str], state_dim: int):
        super().__init__()
        self.image_keys = list(encoders)
        self.state_keys = list(state_keys)
        # ModuleDict names may not hold "." (camera paths may): index by position instead.
        self.images = nn.ModuleList(encoders.values())
        self.out_dim = sum(int(e.out_dim) for e in self.images) + int(state_dim)

    def forward(self, obs: Mapping[str, Tensor] | Tensor) -> Tensor:
        if not isinstance(obs, Mapping):  # a single image observation (a 3-D Box space)
            obs = {self.image_keys[0]: obs}
        parts = [enc(obs[k]) for k, enc in zip(self.image_keys, self.images, strict=True)]
        dtype = parts[0].dtype
        parts += [obs[k].reshape(obs[k].shape[0], -1).to(dtype) for k in self.state_keys]
        return torch.cat(parts, dim=-1)


class EncodedEnsembleQ(nn.Module):
    """``Q_e(encoder(s), a)``: an :class:`ObsEncoder` shared by the members, then an :class:`EnsembleQ`.

    Args:
        encoder: the critic's own encoder (trained by the critic loss).
        action_dim, hidden_sizes, num_critics, norm, bn_momentum: as for :class:`EnsembleQ`,
            whose input is the encoder's ``out_dim`` features.

    Shapes: ``obs = {key: [B, ...]}``, ``action[B, A]`` -> ``q[E, B]``.
    """

    def __init__(
        self,
        encoder: ObsEncoder,
        action_dim: int,
        hidden_sizes: Iterable[int] = (256, 256),
        num_critics: int = 2,
        norm: str = "none",
        bn_momentum: float = 0.01,
    ):
        super().__init__()
        self.encoder = encoder
        self.q = EnsembleQ(encoder.out_dim, action_dim, hidden_sizes, num_critics, norm, bn_momentum)
        self.num_critics, self.norm = self.q.num_critics, norm

    def forward(self, obs: Mapping[str, Tensor], action: Tensor) -> Tensor:
        """``obs = {key: [B, ...]}``, ``action[B, A]`` -> ``q[E, B]``."""
        return self.q(self.encoder(obs), action)


@torch.no_grad()
def copy_params(dst: nn.Module, src: Any) -> None:
    """``dst``'s parameters and buffers <- ``src``'s (same architecture), in place."""
    for t, s in zip(dst.parameters(), src.parameters(), strict=True):
        t.copy_(s)
    for t, s in zip(dst.buffers(), src.buffers(), strict=True):
        t.copy_(s)


@torch.no_grad()
def polyak_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """``target <- (1 - tau) * target + tau * source`` for parameters; buffers are copied."""
    for t, s in zip(target.parameters(), source.parameters(), strict=True):
        t.lerp_(s, tau)
    for t, s in zip(target.buffers(), source.buffers(), strict=True):
        t.copy_(s)

"""An MLP actor-critic for flat observations (CleanRL / SB3 ``MlpPolicy`` style).

Separate actor and critic networks by default (no shared trunk), orthogonal init with
gain ``sqrt(2)`` on hidden layers, ``0.01`` on the policy head and ``1.0`` on the value
head, tanh activations. The action head follows the action space: categorical for
``Discrete``, diagonal Gaussian with a state-independent ``log_std`` for ``Box``, or a
tanh-squashed Gaussian (``action_head="squashed_gaussian"``, for SAC). ``act``, ``evaluate``
and ``sample`` come from :class:`~rlinf_nb.policies.base.ActorCriticAPI`.

Shapes: ``N`` = batch, ``obs[N, *obs_shape]`` (flattened to ``[N, obs_dim]``), actions
``[N]`` (Discrete, int64) or ``[N, A]`` (Box), or with ``chunk = k > 1`` ``[N, k]`` /
``[N, k, A]``; log-probs, entropies and values ``[N]``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
from torch import Tensor, nn

from rlinf_nb.config import build, deep_merge, to_dict
from rlinf_nb.policies.base import ActorCriticAPI
from rlinf_nb.policies.distributions import ActionDistribution, layer_init, make_action_head
from rlinf_nb.policies.registry import register_policy
from rlinf_nb.policies.spec import ACTIVATION_NAMES, MLPPolicyConfig, resolve_head_kind

__all__ = ["ACTIVATIONS", "ActorCritic", "MLPPolicyConfig"]

ACTIVATIONS: dict[str, type[nn.Module]] = dict(
    zip(ACTIVATION_NAMES, (nn.Tanh, nn.ReLU, nn.ELU, nn.GELU, nn.SiLU, nn.LeakyReLU), strict=True)
)


def _mlp(in_dim: int, sizes: tuple[int, ...], activation: str, ortho: bool) -> tuple[nn.Sequential, int]:
    layers: list[nn.Module] = []
    for width in sizes:
        linear = nn.Linear(in_dim, width)
        if ortho:
            layer_init(linear, math.sqrt(2.0))
        layers += [linear, ACTIVATIONS[activation]()]
        in_dim = width
    return nn.Sequential(*layers), in_dim


@register_policy("mlp")
class ActorCritic(ActorCriticAPI):
    """MLP actor-critic.

    Args:
        obs_space: a ``Box`` observation space (any shape; flattened).
        action_space: ``Discrete`` or ``Box``.
        config: the architecture; ``None`` = :class:`MLPPolicyConfig` defaults.
        **overrides: config fields to override (validated, e.g. ``hidden_sizes=(256, 256)``).
    """

    def __init__(
        self,
        obs_space: gym.Space,
        action_space: gym.Space,
        config: MLPPolicyConfig | None = None,
        **overrides: Any,
    ):
        super().__init__()
        base = to_dict(config) if config is not None else {}
        self.config: MLPPolicyConfig = build(MLPPolicyConfig, deep_merge(base, overrides))
        cfg = self.config
        if not isinstance(obs_space, gym.spaces.Box):
            raise ValueError(f"ActorCritic needs a Box observation space, got {obs_space}")
        self.obs_space = obs_space
        self.action_space = action_space
        self.obs_dim = int(np.prod(obs_space.shape))

        self.head_kind = resolve_head_kind(cfg.action_head, action_space)

        if cfg.share_trunk:
            trunk, feat = _mlp(self.obs_dim, cfg.hidden_sizes, cfg.activation, cfg.ortho_init)
            self.actor_body = trunk
            self.critic_body = trunk  # the same module: its parameters get both gradients
            actor_feat = critic_feat = feat
        else:
            self.actor_body, actor_feat = _mlp(self.obs_dim, cfg.hidden_sizes, cfg.activation, cfg.ortho_init)
            critic_sizes = (
                cfg.critic_hidden_sizes if cfg.critic_hidden_sizes is not None else cfg.hidden_sizes
            )
            self.critic_body, critic_feat = _mlp(self.obs_dim, critic_sizes, cfg.activation, cfg.ortho_init)

        policy_gain = 0.01 if cfg.ortho_init else 1.0
        self.actor_head, _ = make_action_head(
            self.head_kind, action_space, actor_feat, chunk=cfg.chunk, log_std_init=cfg.log_std_init,
            log_std_min=cfg.log_std_min, log_std_max=cfg.log_std_max, gain=policy_gain,
        )  # fmt: skip
        self.critic_head = nn.Linear(critic_feat, 1)
        if cfg.ortho_init:
            layer_init(self.critic_head, 1.0)
        if not cfg.ortho_init:
            # Keep PyTorch's default init everywhere; re-init the heads that layer_init touched.
            for module in self.actor_head.modules():
                if isinstance(module, nn.Linear):
                    module.reset_parameters()

    # ------------------------------------------------------------------ parameters

    def actor_parameters(self) -> Iterator[nn.Parameter]:
        """Parameters that the policy (action distribution) depends on."""
        yield from self.actor_body.parameters()
        yield from self.actor_head.parameters()

    def critic_parameters(self) -> Iterator[nn.Parameter]:
        """Parameters that the value function depends on."""
        yield from self.critic_body.parameters()
        yield from self.critic_head.parameters()

    def lora_targets(self) -> list[str]:
        """The actor's linear layers: where LoRA adapters go (:mod:`rlinf_nb.policies.lora`)."""
        return [
            f"{part}.{name}" if name else part
            for part in ("actor_body", "actor_head")
            for name, module in getattr(self, part).named_modules()
            if isinstance(module, nn.Linear)
        ]

    # ------------------------------------------------------------------ forward pieces

    def _flat(self, obs: Tensor) -> Tensor:
        if obs.dim() != 2:
            obs = obs.reshape(obs.shape[0], -1)
        if obs.dtype != self.critic_head.weight.dtype:
            obs = obs.to(self.critic_head.weight.dtype)
        return obs

    def distribution(self, obs: Tensor) -> ActionDistribution:
        """The action distribution for ``obs[N, ...]``."""
        return self.actor_head(self.actor_body(self._flat(obs)))

    def value(self, obs: Tensor) -> Tensor:
        """State values ``[N]``."""
        return self.critic_head(self.critic_body(self._flat(obs))).squeeze(-1)

    def _dist_and_value(self, obs: Tensor) -> tuple[ActionDistribution, Tensor]:
        x = self._flat(obs)
        if self.config.share_trunk:
            feat = self.actor_body(x)
            return self.actor_head(feat), self.critic_head(feat).squeeze(-1)
        return self.actor_head(self.actor_body(x)), self.critic_head(self.critic_body(x)).squeeze(-1)

    def extra_repr(self) -> str:
        fields = ", ".join(
            f"{f.name}={getattr(self.config, f.name)!r}" for f in dataclasses.fields(self.config)
        )
        return f"head={self.head_kind}, {fields}"

"""A CNN actor-critic for image observations plus state (registered as ``"cnn"``).

Observations are a ``gym.spaces.Dict`` such as the ``maniskill:`` backend's ``rgb`` mode
gives: image keys ``[N, H, W, C]`` (``uint8`` pixels are scaled to ``[0, 1]``, float
images such as depth are used as they are; ``channels_last=False`` for ``[N, C, H, W]``)
and flat state keys ``[N, D]``. Which key is which follows the space: a 3-D ``Box`` is an
image, anything else is state (flattened); ``image_keys`` / ``state_keys`` choose
explicitly. A plain 3-D ``Box`` observation space is a single image without state.

Network: one conv encoder per image key (``conv_channels`` / ``conv_kernels`` /
``conv_strides``, ReLU, flatten, a linear layer to ``image_feature_dim``, ReLU); the
features of all cameras and the raw state are concatenated and feed an actor MLP and a
critic MLP (``hidden_sizes``). With ``share_encoder`` (default) actor and critic use the
same conv encoders (their parameters get both losses' gradients), else each has its own.

Heads and shapes are those of :class:`~rlinf_nb.policies.mlp.ActorCritic`: actions
``[N]`` / ``[N, A]``, or ``[N, chunk]`` / ``[N, chunk, A]`` with ``chunk > 1``;
log-probs, entropies and values ``[N]``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from rlinf_nb.config import ConfigError, build, deep_merge, param, to_dict
from rlinf_nb.policies.base import ActorCriticAPI
from rlinf_nb.policies.distributions import (
    ACTION_HEADS,
    ActionDistribution,
    layer_init,
    make_action_head,
    resolve_head_kind,
)
from rlinf_nb.policies.mlp import ACTIVATIONS
from rlinf_nb.policies.registry import register_policy

__all__ = ["CNNActorCritic", "CNNPolicyConfig"]


@dataclass
class CNNPolicyConfig:
    """Architecture of :class:`CNNActorCritic`."""

    image_keys: tuple[str, ...] | None = param(
        None, doc="observation keys that are images (None = every 3-D Box in the space)"
    )
    state_keys: tuple[str, ...] | None = param(
        None, doc="observation keys concatenated as state (None = every non-image key)"
    )
    channels_last: bool = param(True, doc="images are [H, W, C] (ManiSkill, cameras); False = [C, H, W]")
    conv_channels: tuple[int, ...] = param((32, 64, 64), doc="output channels of each conv layer")
    conv_kernels: tuple[int, ...] = param((8, 4, 3), doc="kernel size of each conv layer")
    conv_strides: tuple[int, ...] = param((4, 2, 1), doc="stride of each conv layer")
    image_feature_dim: int = param(
        256, doc="features per image after the encoder's linear layer", range=(1, None)
    )
    share_encoder: bool = param(True, doc="actor and critic share the conv encoders")
    hidden_sizes: tuple[int, ...] = param((256,), doc="widths of the actor's and the critic's MLP layers")
    activation: str = param("relu", doc="activation of the MLP layers", choices=tuple(ACTIVATIONS))
    action_head: str = param(
        "auto",
        doc="action distribution; auto = categorical for Discrete, gaussian for Box",
        choices=ACTION_HEADS,
    )
    log_std_init: float = param(0.0, doc="initial log std of the Gaussian head", range=(-20.0, 5.0))
    log_std_min: float = param(-5.0, doc="lower bound of the squashed Gaussian's log std", range=(-20.0, 5.0))
    log_std_max: float = param(2.0, doc="upper bound of the squashed Gaussian's log std", range=(-20.0, 5.0))
    chunk: int = param(1, doc="actions per step (an action chunk): [N, chunk(, A)] when > 1", range=(1, 1024))

    def validate(self) -> None:
        n = len(self.conv_channels)
        if n == 0:
            raise ConfigError("conv_channels", self.conv_channels, "needs at least one conv layer")
        for name in ("conv_kernels", "conv_strides"):
            if len(getattr(self, name)) != n:
                raise ConfigError(
                    name, getattr(self, name), f"needs one entry per conv layer ({n}, like conv_channels)"
                )
        for name in ("conv_channels", "conv_kernels", "conv_strides", "hidden_sizes"):
            if any(v < 1 for v in getattr(self, name)):
                raise ConfigError(name, getattr(self, name), "every entry must be >= 1")
        if self.log_std_min >= self.log_std_max:
            raise ConfigError("log_std_min", self.log_std_min, f"must be < log_std_max ({self.log_std_max})")


class ImageEncoder(nn.Module):
    """``image[N, H, W, C]`` (or ``[N, C, H, W]``) -> ``features[N, F]``."""

    def __init__(self, space: gym.spaces.Box, cfg: CNNPolicyConfig):
        super().__init__()
        shape = tuple(space.shape)
        self.channels_last = cfg.channels_last
        self.scale = 1.0 / 255.0 if space.dtype == np.uint8 else 1.0
        c, h, w = (shape[2], shape[0], shape[1]) if cfg.channels_last else shape
        layers: list[nn.Module] = []
        in_ch = c
        for out_ch, k, s in zip(cfg.conv_channels, cfg.conv_kernels, cfg.conv_strides, strict=True):
            conv = nn.Conv2d(in_ch, out_ch, k, s)
            nn.init.orthogonal_(conv.weight, math.sqrt(2.0))
            nn.init.zeros_(conv.bias)
            layers += [conv, nn.ReLU()]
            in_ch = out_ch
        self.conv = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            try:
                flat = self.conv(torch.zeros(1, c, h, w)).shape[1]
            except RuntimeError as exc:
                raise ValueError(
                    f"CNN policy: image of shape {shape} is too small for the conv layers "
                    f"(kernels {cfg.conv_kernels}, strides {cfg.conv_strides}): {exc}"
                ) from None
        self.proj = nn.Sequential(layer_init(nn.Linear(flat, cfg.image_feature_dim)), nn.ReLU())
        self.out_dim = cfg.image_feature_dim

    def forward(self, image: Tensor) -> Tensor:
        x = image.float()
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)
        if self.scale != 1.0:
            x = x * self.scale
        return self.proj(self.conv(x))


def _mlp(in_dim: int, sizes: tuple[int, ...], activation: str) -> tuple[nn.Sequential, int]:
    layers: list[nn.Module] = []
    for width in sizes:
        layers += [layer_init(nn.Linear(in_dim, width)), ACTIVATIONS[activation]()]
        in_dim = width
    return nn.Sequential(*layers), in_dim


def _module_key(key: str) -> str:
    return key.replace(".", "_")  # nn.ModuleDict keys may not hold dots


@register_policy("cnn")
class CNNActorCritic(ActorCriticAPI):
    """CNN (images) + state actor-critic.

    Args:
        obs_space: a ``Dict`` of image and state ``Box`` es, or one image ``Box`` (3-D).
        action_space: ``Discrete`` or ``Box``.
        config: the architecture; ``None`` = :class:`CNNPolicyConfig` defaults.
        **overrides: config fields to override (validated).
    """

    def __init__(
        self,
        obs_space: gym.Space,
        action_space: gym.Space,
        config: CNNPolicyConfig | None = None,
        **overrides: Any,
    ):
        super().__init__()
        base = to_dict(config) if config is not None else {}
        self.config: CNNPolicyConfig = build(CNNPolicyConfig, deep_merge(base, overrides))
        cfg = self.config
        self.obs_space = obs_space
        self.action_space = action_space
        self._single_image = isinstance(obs_space, gym.spaces.Box)
        if self._single_image:
            if len(obs_space.shape) != 3:
                raise ValueError(f"CNN policy: a Box observation must be an image [H, W, C], got {obs_space}")
            spaces: dict[str, gym.Space] = {"image": obs_space}
        elif isinstance(obs_space, gym.spaces.Dict):
            spaces = dict(obs_space.spaces)
        else:
            raise ValueError(
                f"CNN policy needs a Dict (images + state) or an image Box space, got {obs_space}"
            )
        for key, space in spaces.items():
            if not isinstance(space, gym.spaces.Box):
                raise ValueError(f"CNN policy: observation key {key!r} must be a Box, got {space}")
        auto_images = [k for k, s in spaces.items() if len(s.shape) == 3]
        self.image_keys = list(cfg.image_keys) if cfg.image_keys is not None else auto_images
        rest = [k for k in spaces if k not in self.image_keys]
        self.state_keys = list(cfg.state_keys) if cfg.state_keys is not None else rest
        for field, keys in (("image_keys", self.image_keys), ("state_keys", self.state_keys)):
            missing = [k for k in keys if k not in spaces]
            if missing:
                raise ValueError(
                    f"CNN policy: {field} {missing} not in the observation space ({', '.join(spaces)})"
                )
        for key in self.image_keys:
            if len(spaces[key].shape) != 3:
                raise ValueError(f"CNN policy: image key {key!r} must be 3-D, got shape {spaces[key].shape}")
        if not self.image_keys:
            raise ValueError(
                f"CNN policy: no image keys in {obs_space} (use the 'mlp' policy for state only)"
            )
        self.state_dim = sum(int(np.prod(spaces[k].shape)) for k in self.state_keys)
        self.head_kind = resolve_head_kind(cfg.action_head, action_space)

        def encoders() -> nn.ModuleDict:
            return nn.ModuleDict({_module_key(k): ImageEncoder(spaces[k], cfg) for k in self.image_keys})

        self.actor_encoders = encoders()
        self.critic_encoders = self.actor_encoders if cfg.share_encoder else encoders()
        feat = sum(e.out_dim for e in self.actor_encoders.values()) + self.state_dim
        self.actor_body, actor_feat = _mlp(feat, cfg.hidden_sizes, cfg.activation)
        self.critic_body, critic_feat = _mlp(feat, cfg.hidden_sizes, cfg.activation)
        self.actor_head, _ = make_action_head(
            self.head_kind, action_space, actor_feat, chunk=cfg.chunk, log_std_init=cfg.log_std_init,
            log_std_min=cfg.log_std_min, log_std_max=cfg.log_std_max, gain=0.01,
        )  # fmt: skip
        self.critic_head = layer_init(nn.Linear(critic_feat, 1), 1.0)

    # ------------------------------------------------------------------ parameters

    def actor_parameters(self) -> Iterator[nn.Parameter]:
        """Parameters that the policy depends on (the encoders too when shared)."""
        yield from self.actor_encoders.parameters()
        yield from self.actor_body.parameters()
        yield from self.actor_head.parameters()

    def critic_parameters(self) -> Iterator[nn.Parameter]:
        """Parameters that the value function depends on (the encoders too when shared)."""
        yield from self.critic_encoders.parameters()
        yield from self.critic_body.parameters()
        yield from self.critic_head.parameters()

    # ------------------------------------------------------------------ forward pieces

    def _inputs(self, obs: Any) -> dict[str, Tensor]:
        if self._single_image and not isinstance(obs, Mapping):
            obs = {"image": obs}
        if not isinstance(obs, Mapping):
            raise TypeError(
                f"CNN policy expects a dict observation with keys {self.image_keys + self.state_keys}"
            )
        return {k: torch.as_tensor(v) for k, v in obs.items()}

    def _features(self, x: dict[str, Tensor], encoders: nn.ModuleDict) -> Tensor:
        parts = [encoders[_module_key(k)](x[k]) for k in self.image_keys]
        dtype = self.critic_head.weight.dtype
        parts += [x[k].reshape(x[k].shape[0], -1).to(dtype) for k in self.state_keys]
        return torch.cat(parts, dim=-1)

    def distribution(self, obs: Any) -> ActionDistribution:
        """The action distribution for a batch of observations."""
        return self.actor_head(self.actor_body(self._features(self._inputs(obs), self.actor_encoders)))

    def value(self, obs: Any) -> Tensor:
        """State values ``[N]``."""
        feat = self._features(self._inputs(obs), self.critic_encoders)
        return self.critic_head(self.critic_body(feat)).squeeze(-1)

    def _dist_and_value(self, obs: Any) -> tuple[ActionDistribution, Tensor]:
        x = self._inputs(obs)
        actor_feat = self._features(x, self.actor_encoders)
        critic_feat = actor_feat if self.config.share_encoder else self._features(x, self.critic_encoders)
        dist = self.actor_head(self.actor_body(actor_feat))
        return dist, self.critic_head(self.critic_body(critic_feat)).squeeze(-1)

    def extra_repr(self) -> str:
        fields = ", ".join(
            f"{f.name}={getattr(self.config, f.name)!r}" for f in dataclasses.fields(self.config)
        )
        return f"head={self.head_kind}, images={self.image_keys}, state={self.state_keys}, {fields}"

"""The torch-free description of the built-in policies: head kinds, activations, the MLP's config.

Everything here imports without torch, so processes that only act (env workers running the
numpy copy of an MLP policy, :mod:`rlinf_nb.policies.numpy_mlp`) and clients that only validate
configs never pay torch's import. The torch modules (:mod:`.mlp`, :mod:`.distributions`,
:mod:`.cnn`) build on these names.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym

from rlinf_nb.config import ConfigError, param

__all__ = ["ACTION_HEADS", "ACTIVATION_NAMES", "MLPPolicyConfig", "resolve_head_kind"]

ACTION_HEADS = ("auto", "categorical", "gaussian", "squashed_gaussian")
ACTIVATION_NAMES = ("tanh", "relu", "elu", "gelu", "silu", "leaky_relu")


def resolve_head_kind(kind: str, action_space: gym.Space) -> str:
    """``"auto"`` -> categorical (Discrete) or gaussian (Box); checks the kind fits the space.

    Raises:
        ValueError: an unknown kind, or a kind that does not fit the action space.
    """
    if kind not in ACTION_HEADS:
        raise ValueError(f"action_head: got {kind!r}; allowed values: {', '.join(ACTION_HEADS)}")
    if kind == "auto":
        if isinstance(action_space, gym.spaces.Discrete):
            return "categorical"
        if isinstance(action_space, gym.spaces.Box):
            return "gaussian"
        raise ValueError(f"policies support Discrete or Box action spaces, got {action_space}")
    if kind == "categorical" and not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"action_head 'categorical' needs a Discrete action space, got {action_space}")
    if kind != "categorical" and not isinstance(action_space, gym.spaces.Box):
        raise ValueError(f"action_head {kind!r} needs a Box action space, got {action_space}")
    return kind


@dataclass
class MLPPolicyConfig:
    """Architecture of :class:`ActorCritic`."""

    hidden_sizes: tuple[int, ...] = param(
        (64, 64), doc="widths of the actor's hidden layers (and of the shared trunk)"
    )
    critic_hidden_sizes: tuple[int, ...] | None = param(
        None, doc="widths of the critic's hidden layers; None = same as hidden_sizes"
    )
    activation: str = param("tanh", doc="hidden-layer activation", choices=ACTIVATION_NAMES)
    share_trunk: bool = param(
        False, doc="actor and critic share the hidden layers (one trunk, two linear heads)"
    )
    action_head: str = param(
        "auto",
        doc="action distribution; auto = categorical for Discrete, gaussian for Box",
        choices=ACTION_HEADS,
    )
    log_std_init: float = param(0.0, doc="initial log std of the Gaussian head", range=(-20.0, 5.0))
    log_std_min: float = param(-5.0, doc="lower bound of the squashed Gaussian's log std", range=(-20.0, 5.0))
    log_std_max: float = param(2.0, doc="upper bound of the squashed Gaussian's log std", range=(-20.0, 5.0))
    ortho_init: bool = param(
        True, doc="orthogonal init (gains sqrt(2) hidden, 0.01 policy head, 1 value head)"
    )
    chunk: int = param(1, doc="actions per step (an action chunk): [N, chunk(, A)] when > 1", range=(1, 1024))

    def validate(self) -> None:
        for name in ("hidden_sizes", "critic_hidden_sizes"):
            sizes = getattr(self, name)
            if sizes is not None and any(s < 1 for s in sizes):
                raise ConfigError(name, sizes, "every layer width must be >= 1")
        if self.share_trunk and self.critic_hidden_sizes is not None:
            raise ConfigError(
                "critic_hidden_sizes", self.critic_hidden_sizes, "must be None when share_trunk is true"
            )
        if self.log_std_min >= self.log_std_max:
            raise ConfigError("log_std_min", self.log_std_min, f"must be < log_std_max ({self.log_std_max})")

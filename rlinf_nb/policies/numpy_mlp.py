"""The ``mlp`` policy's acting half in numpy: ``act`` and ``value`` from its weights, without torch.

Env workers and rollout workers only act: they need the action, its log-prob and the value
for a batch of observations, never gradients. For the registered ``"mlp"``
:class:`~rlinf_nb.policies.mlp.ActorCritic` that is a few small matrix products, which numpy
does in a fraction of torch's per-call overhead (bench/bench_maniskill.py), and a process
that acts in numpy never imports torch (a second or more of every run's start-up on a small
machine). :func:`numpy_policy` builds one where the policy config allows it (see
:func:`numpy_support`); the caller keeps torch for everything else.

The maths mirrors the torch modules term by term (:mod:`.distributions`): the same layers
read from the same ``state_dict`` keys, Gumbel-max sampling for the categorical head, the
same Gaussian log-density and the same squash correction, so the learner's log-probs of
these actions match the ones reported here to float32 rounding (tests/test_numpy_policy.py).
The random stream is numpy's, not torch's: the same seed gives other (equally distributed)
samples than the torch policy.

Shapes: ``obs[N, *obs_shape]`` (flattened); actions ``[N]`` (int64) or ``[N, A]`` (float32),
with ``chunk = k > 1`` ``[N, k]`` / ``[N, k, A]``; log-probs and values ``[N]`` float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from rlinf_nb.config import build
from rlinf_nb.policies.spec import MLPPolicyConfig, resolve_head_kind

__all__ = ["NumpyMLPPolicy", "numpy_policy", "numpy_support"]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_LOG2 = math.log(2.0)

_ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0.0),
    "elu": lambda x: np.where(x > 0.0, x, np.expm1(np.minimum(x, 0.0))),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "leaky_relu": lambda x: np.where(x > 0.0, x, 0.01 * x),
}  # gelu (erf) is not here: an mlp policy with gelu acts in torch


def numpy_support(policy_cfg: dict[str, Any], obs_space: gym.Space, action_space: gym.Space) -> str | None:
    """``None`` when :class:`NumpyMLPPolicy` can act for this policy section, else why not (one line)."""
    if policy_cfg.get("name") != "mlp":
        return f"policy {policy_cfg.get('name')!r} has no numpy copy (only 'mlp' does)"
    if not isinstance(obs_space, gym.spaces.Box):
        return f"the observation space is {type(obs_space).__name__}, not a Box"
    if not isinstance(action_space, gym.spaces.Discrete | gym.spaces.Box):
        return f"the action space is {type(action_space).__name__}, not Discrete or Box"
    cfg = _config(policy_cfg)
    if cfg.activation not in _ACTIVATIONS:
        return f"activation {cfg.activation!r} has no numpy copy (allowed: {', '.join(_ACTIVATIONS)})"
    return None


def numpy_policy(policy_cfg: dict[str, Any], obs_space: gym.Space, action_space: gym.Space,
                 seed: int) -> NumpyMLPPolicy | None:  # fmt: skip
    """A :class:`NumpyMLPPolicy` for this policy section, or ``None`` where :func:`numpy_support` says no."""
    if numpy_support(policy_cfg, obs_space, action_space) is not None:
        return None
    return NumpyMLPPolicy(_config(policy_cfg), obs_space, action_space, seed)


def _config(policy_cfg: dict[str, Any]) -> MLPPolicyConfig:
    kwargs = dict(policy_cfg.get("kwargs") or {})
    kwargs.pop("config", None)  # a config object only comes from Python code, never from a run's section
    chunk = int(policy_cfg.get("chunk", 1))
    return build(MLPPolicyConfig, {**kwargs, **({"chunk": chunk} if chunk > 1 else {})})


class NumpyMLPPolicy:
    """``act`` / ``value`` of an ``mlp`` ActorCritic from its weights (load them with :meth:`load`).

    Args:
        config: the policy's architecture (what ``make_policy("mlp", ..., **kwargs)`` resolves).
        obs_space, action_space: the env's spaces (the action space picks the head, as in torch).
        seed: seeds this policy's own numpy generator (action sampling).
    """

    def __init__(self, config: MLPPolicyConfig, obs_space: gym.Space, action_space: gym.Space, seed: int):
        self.config = config
        self.head_kind = resolve_head_kind(config.action_head, action_space)
        self.obs_dim = int(np.prod(obs_space.shape))
        self.action_shape: tuple[int, ...] = (
            () if self.head_kind == "categorical" else tuple(action_space.shape)
        )
        self.chunk = config.chunk
        self.activation = _ACTIVATIONS[config.activation]
        # (feat, deterministic) -> (action, logprob)
        self._sample = getattr(self, f"_sample_{self.head_kind}")
        self.rng = np.random.default_rng([seed, 0x5EED])
        self.loaded = False
        self._actor: list[tuple[np.ndarray, np.ndarray]] = []
        self._critic: list[tuple[np.ndarray, np.ndarray]] = []
        self._head: dict[str, np.ndarray] = {}

    # ------------------------------------------------------------------ weights

    def load(self, weights: dict[str, np.ndarray]) -> None:
        """Take the torch policy's ``state_dict`` (as numpy arrays); raises ``KeyError`` naming a missing key."""
        self._actor = _linears(weights, "actor_body")
        self._critic = _linears(weights, "critic_body") + [_linear(weights, "critic_head")]
        head = "actor_head.head" if self.chunk > 1 else "actor_head"
        if self.head_kind == "categorical":
            self._head = {"logits": _linear(weights, f"{head}.logits")}
        elif self.head_kind == "gaussian":
            log_std = _array(weights, f"{head}.log_std")  # state-independent: its terms are computed once
            self._head = {
                "mean": _linear(weights, f"{head}.mean"),
                "std": np.exp(log_std),
                "log_norm": np.float32(-(log_std.sum() + log_std.size * _HALF_LOG_2PI)),
            }
        else:
            self._head = {
                "mean": _linear(weights, f"{head}.mean"),
                "log_std": _linear(weights, f"{head}.log_std"),
                "loc": _array(weights, f"{head}.action_loc"),
                "scale": _array(weights, f"{head}.action_scale"),
            }
        self.loaded = True

    # ------------------------------------------------------------------ acting

    def _flat(self, obs: np.ndarray) -> np.ndarray:
        if not self.loaded:
            raise RuntimeError("this numpy policy has no weights yet (load() the learner's state_dict first)")
        obs = np.asarray(obs)
        return obs.reshape(obs.shape[0], -1).astype(np.float32, copy=False)

    def _body(self, x: np.ndarray, layers: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        for w_t, b in layers:
            x = self.activation(x @ w_t + b)
        return x

    def value(self, obs: np.ndarray) -> np.ndarray:
        """State values ``[N]`` float32."""
        x = self._body(self._flat(obs), self._critic[:-1])
        w_t, b = self._critic[-1]
        return (x @ w_t + b)[:, 0]

    def act(self, obs: np.ndarray, deterministic: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``obs -> (action, logprob[N], value[N])``, actions sampled from this policy's generator, or its
        mode with ``deterministic`` (as torch: the argmax, the mean, the squashed mean; with their log-probs)."""
        x = self._flat(obs)
        action, logprob = self.act_without_value(x, deterministic)
        return action, logprob, self.value(x)

    def act_without_value(
        self, obs: np.ndarray, deterministic: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`act` without the critic's pass: ``obs -> (action, logprob[N])`` (off-policy collection)."""
        return self._sample(self._body(self._flat(obs), self._actor), deterministic)

    def _standard_normal(self, shape: tuple[int, ...], deterministic: bool) -> np.ndarray:
        """``z ~ N(0, 1)`` from this policy's generator; zeros (the mode) when ``deterministic``."""
        if deterministic:
            return np.zeros(shape, np.float32)
        return self.rng.standard_normal(shape, dtype=np.float32)

    def _sample_categorical(self, feat: np.ndarray, deterministic: bool) -> tuple[np.ndarray, np.ndarray]:
        w_t, b = self._head["logits"]
        raw = feat @ w_t + b  # [N, chunk * K]
        if self.chunk > 1:
            raw = raw.reshape(raw.shape[0], self.chunk, -1)
        # Gumbel-max, as the torch head: argmax(logits - log(Exponential(1)))
        if deterministic:
            action = np.argmax(raw, axis=-1).astype(np.int64)
        else:
            noise = np.log(self.rng.standard_exponential(raw.shape, dtype=np.float32))
            action = np.argmax(raw - noise, axis=-1).astype(np.int64)
        shifted = raw - raw.max(-1, keepdims=True)
        log_norm = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        logprob = np.take_along_axis(log_norm, action[..., None], -1)[..., 0]
        return action, (logprob.sum(-1) if self.chunk > 1 else logprob).astype(np.float32)

    def _gaussian(
        self, mean: np.ndarray, log_std: np.ndarray, deterministic: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """``u = mean + std * z`` and its log-density: ``-z^2 / 2 - log_std - log(2 pi) / 2`` summed."""
        z = self._standard_normal(mean.shape, deterministic)
        u = mean + np.exp(log_std) * z
        return u, (-0.5 * z * z - log_std - _HALF_LOG_2PI).sum(-1)

    def _sample_gaussian(self, feat: np.ndarray, deterministic: bool) -> tuple[np.ndarray, np.ndarray]:
        """The state-independent log_std's terms were summed at :meth:`load` (``log_norm``)."""
        w_t, b = self._head["mean"]
        z = self._standard_normal((feat.shape[0], b.shape[0]), deterministic)
        action = (feat @ w_t + b) + self._head["std"] * z
        logprob = self._head["log_norm"] - 0.5 * (z * z).sum(-1)
        return self._shaped(action), logprob.astype(np.float32, copy=False)

    def _sample_squashed_gaussian(
        self, feat: np.ndarray, deterministic: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        (mw, mb), (sw, sb) = self._head["mean"], self._head["log_std"]
        cfg = self.config
        raw = np.tanh(feat @ sw + sb)
        log_std = cfg.log_std_min + 0.5 * (raw + 1.0) * (cfg.log_std_max - cfg.log_std_min)
        u, logprob = self._gaussian(feat @ mw + mb, log_std, deterministic)
        scale = self._head["scale"]
        # log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u)), plus the affine map's log(scale)
        log_det = (2.0 * (_LOG2 - u - np.logaddexp(0.0, -2.0 * u))).sum(-1) + np.log(scale).sum()
        action = self._head["loc"] + scale * np.tanh(u)
        return self._shaped(action.astype(np.float32)), (logprob - log_det).astype(np.float32)

    def _shaped(self, flat: np.ndarray) -> np.ndarray:
        """``[N, chunk * A]`` -> ``[N, chunk, *action_shape]`` with chunks; flat ``[N, A]`` without (as torch)."""
        flat = flat.astype(np.float32, copy=False)
        if self.chunk > 1:
            return flat.reshape(flat.shape[0], self.chunk, *self.action_shape)
        return flat


def _array(weights: dict[str, np.ndarray], key: str) -> np.ndarray:
    if key not in weights:
        raise KeyError(f"the weights have no {key!r} (is this an 'mlp' policy's state_dict?)")
    return np.asarray(weights[key], np.float32)


def _linear(weights: dict[str, np.ndarray], prefix: str) -> tuple[np.ndarray, np.ndarray]:
    """``(W^T, b)`` of the linear layer at ``prefix`` (transposed once, so acting is ``x @ W^T + b``)."""
    return np.ascontiguousarray(_array(weights, f"{prefix}.weight").T), _array(weights, f"{prefix}.bias")


def _linears(weights: dict[str, np.ndarray], body: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """The linear layers of an ``nn.Sequential`` body (``<body>.<index>.weight``), in order."""
    indices = sorted(
        {int(k.split(".")[1]) for k in weights if k.startswith(f"{body}.") and k.endswith(".weight")}
    )
    return [_linear(weights, f"{body}.{i}") for i in indices]

"""``make_env``: the one env factory, with a registry of spec prefixes.

``make_env("CartPole-v1", num_envs=8, seed=0)`` (or ``"gym:CartPole-v1"``) gives a
:class:`VecEnv`: ``num_envs`` copies stepped together, auto-resetting in the same
step, with the true final observation of every finished episode kept for
time-limit bootstrapping and per-episode returns and lengths counted. Other
backends (``maniskill:``, ``robot:``) register a prefix with :func:`register_env_backend`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

_BACKENDS: dict[str, Callable[..., VecEnv]] = {}
# prefix -> module that registers it when imported (imported on first use)
_LAZY_BACKENDS = {"robot": "rlinf_nb.envs.robot_env"}


def register_env_backend(prefix: str) -> Callable:
    """Decorator: ``factory(env_id, num_envs, seed, **kwargs) -> VecEnv`` serves ``"prefix:env_id"``."""

    def decorator(factory: Callable[..., VecEnv]) -> Callable[..., VecEnv]:
        _BACKENDS[prefix] = factory
        return factory

    return decorator


@dataclass
class StepResult:
    """One vectorised step. Shapes: ``[N, ...]`` for arrays."""

    obs: np.ndarray  # observation to act on next (already reset where an episode ended)
    reward: np.ndarray  # float32 [N]
    terminated: np.ndarray  # bool [N]
    truncated: np.ndarray  # bool [N]
    final_obs: np.ndarray | None  # [N, ...] true last observation where done, else zeros; None if none ended
    episode_returns: list[float] = field(default_factory=list)  # of episodes that ended this step
    episode_lengths: list[int] = field(default_factory=list)
    successes: list[float] = field(default_factory=list)  # where the env reports "success"


class VecEnv:
    """``num_envs`` gymnasium envs with same-step autoreset and episode bookkeeping."""

    def __init__(self, env_id: str, num_envs: int, seed: int | None = None, **kwargs: Any):
        self.env_id = env_id
        self.num_envs = num_envs
        try:
            self._env = gym.make_vec(
                env_id,
                num_envs=num_envs,
                vectorization_mode="sync",
                vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
                **kwargs,
            )
        except gym.error.Error as exc:
            raise ValueError(f"make_env: cannot make gymnasium env {env_id!r}: {exc}") from None
        self.observation_space = self._env.single_observation_space
        self.action_space = self._env.single_action_space
        self._seed = seed
        self._returns = np.zeros(num_envs, dtype=np.float64)
        self._lengths = np.zeros(num_envs, dtype=np.int64)

    def reset(self, seed: int | None = None) -> np.ndarray:
        obs, _ = self._env.reset(seed=seed if seed is not None else self._seed)
        self._returns[:] = 0
        self._lengths[:] = 0
        return obs

    def step(self, action: np.ndarray) -> StepResult:
        obs, reward, terminated, truncated, info = self._env.step(action)
        reward = np.asarray(reward, dtype=np.float32)
        self._returns += reward
        self._lengths += 1
        done = np.logical_or(terminated, truncated)
        result = StepResult(obs, reward, np.asarray(terminated, bool), np.asarray(truncated, bool), None)
        if done.any():
            final = np.zeros_like(obs)
            mask = info.get("_final_obs", done)
            for i in np.flatnonzero(done):
                if mask[i]:
                    final[i] = info["final_obs"][i]
            result.final_obs = final
            result.episode_returns = self._returns[done].tolist()
            result.episode_lengths = self._lengths[done].tolist()
            final_info = info.get("final_info", {})
            if isinstance(final_info, dict) and "success" in final_info:
                result.successes = [float(s) for s in np.asarray(final_info["success"])[done]]
            self._returns[done] = 0
            self._lengths[done] = 0
        return result

    def render(self) -> np.ndarray | None:
        frames = self._env.render()
        if frames is None:
            return None
        return np.asarray(frames[0] if isinstance(frames, list | tuple) else frames)

    def close(self) -> None:
        self._env.close()


@register_env_backend("gym")
def _gym_backend(env_id: str, num_envs: int, seed: int | None, **kwargs: Any) -> VecEnv:
    return VecEnv(env_id, num_envs, seed, **kwargs)


def make_env(spec: str, num_envs: int = 1, seed: int | None = None, **kwargs: Any) -> VecEnv:
    """Make ``num_envs`` envs from ``spec`` (``"CartPole-v1"``, ``"gym:Pendulum-v1"``, ...).

    Raises:
        ValueError: for an unknown backend prefix (listing the known ones) or env id.
    """
    prefix, sep, env_id = spec.partition(":")
    if not sep:
        prefix, env_id = "gym", spec
    if prefix not in _BACKENDS and prefix in _LAZY_BACKENDS:
        importlib.import_module(_LAZY_BACKENDS[prefix])
    if prefix not in _BACKENDS:
        known = ", ".join(sorted(set(_BACKENDS) | set(_LAZY_BACKENDS)))
        raise ValueError(f"make_env: unknown env backend {prefix!r} in {spec!r}; known backends: {known}")
    if num_envs < 1:
        raise ValueError(f"make_env: num_envs must be >= 1, got {num_envs}")
    return _BACKENDS[prefix](env_id, num_envs, seed, **kwargs)


__all__ = ["StepResult", "VecEnv", "make_env", "register_env_backend"]

# Backends in their own modules register themselves on import (their heavy imports stay lazy).
from rlinf_nb.envs import maniskill as _maniskill  # noqa: E402, F401

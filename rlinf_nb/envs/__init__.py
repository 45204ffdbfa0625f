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

from rlinf_nb import tree

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
    # Human in the loop (robot envs with an intervention; None elsewhere):
    intervened: np.ndarray | None = None  # bool [N]: the human drove this step
    applied_actions: np.ndarray | None = None  # [N, A]: the actions really sent (human, blend or agent)
    episode_intervened: list[bool] = field(default_factory=list)  # per ended episode: any step intervened
    intervened_arms: np.ndarray | None = None  # bool [N, n_arms]: the human drove that arm (order: arm_paths)
    human_mask: np.ndarray | None = None  # bool [N, A]: the action dims the human drove
    arm_paths: tuple[str, ...] = ()  # the arms of intervened_arms


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
        self._ep_intervened = np.zeros(num_envs, dtype=bool)

    def reset(self, seed: int | list[int] | None = None) -> np.ndarray:
        """Reset every env; ``seed``: int (env ``i`` gets ``seed + i``), one seed per env, or None (the env's seed)."""
        obs, _ = self._env.reset(seed=seed if seed is not None else self._seed)
        self._returns[:] = 0
        self._lengths[:] = 0
        self._ep_intervened[:] = False
        return obs

    @property
    def envs(self) -> list[gym.Env]:
        """The sub-envs (unwrapped of gymnasium's wrappers), e.g. to pass human commands to a robot env."""
        return [e.unwrapped for e in self._env.envs]

    def step(self, action: np.ndarray) -> StepResult:
        obs, reward, terminated, truncated, info = self._env.step(action)
        reward = np.asarray(reward, dtype=np.float32)
        self._returns += reward
        self._lengths += 1
        done = np.logical_or(terminated, truncated)
        result = StepResult(obs, reward, np.asarray(terminated, bool), np.asarray(truncated, bool), None)
        intervened = _step_info(info, "intervened", done)
        if intervened is not None:
            result.intervened = intervened.astype(bool)
            result.applied_actions = _step_info(info, "applied_action", done)
            self._ep_intervened |= result.intervened
            arms = _step_info(info, "intervened_arms", done)
            if arms is not None:
                result.intervened_arms = arms.astype(bool)
                mask = _step_info(info, "human_mask", done)
                result.human_mask = None if mask is None else mask.astype(bool)
                result.arm_paths = tuple(getattr(self.envs[0], "arm_paths", ()))
        if done.any():
            final = tree.map(np.zeros_like, obs)  # an array, or a dict of arrays (Dict spaces)
            mask = info.get("_final_obs", done)
            for i in np.flatnonzero(done):
                if mask[i]:
                    tree.assign(final, i, info["final_obs"][i])
            result.final_obs = final
            result.episode_returns = self._returns[done].tolist()
            result.episode_lengths = self._lengths[done].tolist()
            final_info = info.get("final_info", {})
            if isinstance(final_info, dict) and "success" in final_info:
                result.successes = [float(s) for s in np.asarray(final_info["success"])[done]]
            if intervened is not None:
                result.episode_intervened = self._ep_intervened[done].tolist()
            self._returns[done] = 0
            self._lengths[done] = 0
            self._ep_intervened[done] = False
        return result

    def render(self) -> np.ndarray | None:
        frames = self._env.render()
        if frames is None:
            return None
        return np.asarray(frames[0] if isinstance(frames, list | tuple) else frames)

    def close(self) -> None:
        self._env.close()


def _step_info(info: dict[str, Any], key: str, done: np.ndarray) -> np.ndarray | None:
    """``key`` of each sub-env's *step* info (same-step autoreset moves it to ``final_info`` where done)."""
    final = info.get("final_info", {})
    if key not in info and not (isinstance(final, dict) and key in final):
        return None
    if key in info:
        out = np.array(info[key])
    else:
        out = np.zeros_like(np.asarray(final[key]))
    if done.any() and isinstance(final, dict) and key in final:
        out[done] = np.asarray(final[key])[done]
    return out


@register_env_backend("gym")
def _gym_backend(env_id: str, num_envs: int, seed: int | None, **kwargs: Any) -> VecEnv:
    return VecEnv(env_id, num_envs, seed, **kwargs)


def make_env(
    spec: str, num_envs: int = 1, seed: int | None = None, link: Any = None, **kwargs: Any
) -> VecEnv:
    """Make ``num_envs`` envs from ``spec`` (``"CartPole-v1"``, ``"gym:Pendulum-v1"``, ...).

    ``link``: observation/action delays (a :class:`~rlinf_nb.link.LinkConfig` or its mapping), see
    :mod:`rlinf_nb.envs.latency`.

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
    if link is not None:
        from rlinf_nb.envs.latency import apply_link, link_config

        link = link_config(link)  # validated before the env is made
        return apply_link(_BACKENDS[prefix](env_id, num_envs, seed, **kwargs), link, seed)
    return _BACKENDS[prefix](env_id, num_envs, seed, **kwargs)


__all__ = ["StepResult", "VecEnv", "make_env", "register_env_backend"]

# Backends in their own modules register themselves on import (their heavy imports stay lazy).
from rlinf_nb.envs import maniskill as _maniskill  # noqa: E402, F401

"""Observation and action delays on any :class:`~rlinf_nb.envs.VecEnv`: edge–cloud conditions in simulation.

    env = make_env("robot:mock_arm/reach", 4, seed=0,
                   link={"obs_delay": {"kind": "uniform", "low_ms": 0, "high_ms": 40},
                         "action_delay": {"kind": "constant", "ms": 20}, "dt_ms": 20})

or ``apply_link(env, LinkConfig(...), seed)``; a run sets ``env.link`` (see :class:`~rlinf_nb.link.LinkConfig`).
The wrappers work on the vectorised level, so they serve every backend and the runtime's env workers.

The model: every observation and every action is a message with its own delay, drawn from a
:class:`~rlinf_nb.link.DelayDistribution` and turned into control steps with ``dt_ms``
(``ceil(ms / dt_ms)``: a message is used at the first tick at or after it lands).

* **Observations** (:class:`ObsDelay`): at each step the policy sees the newest observation that has
  arrived. Since "newest arrived" only moves forward, the policy never sees an observation older
  than one it already saw (a message overtaken by a newer one is dropped). A constant delay of
  ``k`` steps shows the observation of step ``t - k``.
* **Actions** (:class:`ActionDelay`): the env applies the newest action that has arrived and holds
  it while nothing newer lands (zero-order hold, as an actuator does). A constant delay of ``k``
  steps applies at step ``t`` the action decided at ``t - k``.

Episode boundaries (the rule: nothing crosses a reset):

* An episode's first observation (from the reset) is shown at once (a reset waits until the start
  state is observed, as a real robot's does); delayed observations of the old episode are dropped.
* ``final_obs`` of an ended episode is the delayed view at its last step (what the policy would
  have seen), consistent with the ``obs`` of the steps before it.
* Actions decided in an episode are never applied in the next one: a reset clears the action queue,
  and until the new episode's first action arrives the env applies ``action_fill``: ``"zero"``
  (zeros, clipped into the action space) or ``"hold"`` (the last action applied before the reset).

Rewards, terminations, truncations and episode statistics are the env's own (not delayed). Delays
are drawn per env per step from seeded generators (separate streams for observations and actions),
so a run is reproducible given its seed; ``reset(seed=...)`` reseeds them as it reseeds the env.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rlinf_nb.config import build
from rlinf_nb.envs import StepResult, VecEnv
from rlinf_nb.link import DelayDistribution, LinkConfig, delay_steps

__all__ = ["ActionDelay", "ObsDelay", "apply_link", "link_config"]

_OBS_STREAM, _ACTION_STREAM = 0x0B5, 0xAC7


def _rng(seed: int | list[int] | None, stream: int) -> np.random.Generator:
    if seed is None:
        return np.random.default_rng()
    seeds = [seed] if isinstance(seed, int | np.integer) else list(seed)
    return np.random.default_rng([stream, *(int(s) % 2**32 for s in seeds)])


def _take(x: Any, i: int) -> Any:
    """Env ``i``'s part of a batched observation (an array or a dict of arrays), copied."""
    if isinstance(x, Mapping):
        return {k: _take(v, i) for k, v in x.items()}
    return np.array(x[i], copy=True)


def _stack(items: list[Any]) -> Any:
    if isinstance(items[0], Mapping):
        return {k: _stack([it[k] for it in items]) for k in items[0]}
    return np.stack(items)


class _Wrapper:
    """Forwards everything it does not override to the wrapped env (spaces, envs, render, close, ...)."""

    def __init__(self, env: VecEnv | _Wrapper):
        self.env = env
        self.num_envs = env.num_envs

    def __getattr__(self, name: str) -> Any:
        if name == "env":  # not set yet (e.g. while unpickling): avoid recursing
            raise AttributeError(name)
        return getattr(self.env, name)

    @property
    def unwrapped(self) -> VecEnv:
        env = self.env
        while isinstance(env, _Wrapper):
            env = env.env
        return env


class ObsDelay(_Wrapper):
    """The policy sees the newest observation that has arrived (see the module docstring for the rules)."""

    def __init__(self, env: VecEnv | _Wrapper, delay: DelayDistribution | Mapping[str, Any] | float,
                 dt_ms: float, seed: int | None = None):  # fmt: skip
        super().__init__(env)
        self.delay = DelayDistribution.of(delay, path="obs_delay")
        if not dt_ms > 0:
            raise ValueError(f"ObsDelay: dt_ms must be > 0, got {dt_ms}")
        self.dt_ms = float(dt_ms)
        self._seed = seed
        self._rng = _rng(seed, _OBS_STREAM)
        self._t = np.zeros(self.num_envs, np.int64)
        # per env: (step index, arrival step, observation); the head is the one shown now
        self._queues: list[deque[tuple[int, int, Any]]] = [deque() for _ in range(self.num_envs)]
        self.shown_index = np.zeros(self.num_envs, np.int64)  # episode step of the observation shown

    def reset(self, seed: int | list[int] | None = None) -> Any:
        obs = self.env.reset(seed=seed)
        self._rng = _rng(seed if seed is not None else self._seed, _OBS_STREAM)
        self._t[:] = 0
        self.shown_index[:] = 0
        for i, q in enumerate(self._queues):
            q.clear()
            q.append((0, 0, _take(obs, i)))
        return obs

    def step(self, action: Any) -> StepResult:
        res = self.env.step(action)
        lag = delay_steps(self.delay.sample(self._rng, self.num_envs), self.dt_ms)
        done = np.logical_or(res.terminated, res.truncated)
        shown, finals = [], {}
        for i, q in enumerate(self._queues):
            t = int(self._t[i]) + 1
            newest = res.final_obs if done[i] else res.obs
            q.append((t, t + int(lag[i]), _take(newest, i)))
            arrived = max(j for j, (_, arrival, _) in enumerate(q) if arrival <= t)  # q[0] always has
            for _ in range(arrived):
                q.popleft()  # overtaken: never shown (the view only moves forward)
            if done[i]:
                finals[i] = q[0][2]
                q.clear()
                q.append((0, 0, _take(res.obs, i)))
                self._t[i] = 0
            else:
                self._t[i] = t
            self.shown_index[i] = q[0][0]
            shown.append(q[0][2])
        final_obs = res.final_obs
        if finals:  # the delayed view where an episode ended, the env's own (zeros) elsewhere
            final_obs = _stack(
                [finals[i] if i in finals else _take(res.final_obs, i) for i in range(self.num_envs)]
            )
        return dataclasses.replace(res, obs=_stack(shown), final_obs=final_obs)


class ActionDelay(_Wrapper):
    """The env applies the newest action that has arrived, held until a newer one lands."""

    def __init__(self, env: VecEnv | _Wrapper, delay: DelayDistribution | Mapping[str, Any] | float,
                 dt_ms: float, fill: str = "zero", seed: int | None = None):  # fmt: skip
        super().__init__(env)
        self.delay = DelayDistribution.of(delay, path="action_delay")
        if not dt_ms > 0:
            raise ValueError(f"ActionDelay: dt_ms must be > 0, got {dt_ms}")
        if fill not in ("zero", "hold"):
            raise ValueError(f"ActionDelay: fill must be 'zero' or 'hold', got {fill!r}")
        self.dt_ms = float(dt_ms)
        self.fill = fill
        self._seed = seed
        self._rng = _rng(seed, _ACTION_STREAM)
        self._t = np.zeros(self.num_envs, np.int64)
        self._queues: list[deque[tuple[int, int, np.ndarray]]] = [deque() for _ in range(self.num_envs)]
        self._current: list[np.ndarray | None] = [None] * self.num_envs  # held action of this episode
        self._previous: list[np.ndarray | None] = [None] * self.num_envs  # last applied, across resets
        self.applied_index = np.full(self.num_envs, -1, np.int64)  # episode step the applied action came from
        self.last_applied: np.ndarray | None = None  # the actions the env got at the last step

    def reset(self, seed: int | list[int] | None = None) -> Any:
        obs = self.env.reset(seed=seed)
        self._rng = _rng(seed if seed is not None else self._seed, _ACTION_STREAM)
        self._t[:] = 0
        self.applied_index[:] = -1
        for q in self._queues:
            q.clear()
        self._current = [None] * self.num_envs
        return obs

    def _fill(self, i: int, like: np.ndarray) -> np.ndarray:
        if self.fill == "hold" and self._previous[i] is not None:
            return self._previous[i]
        space = self.env.action_space
        if isinstance(space, gym.spaces.Box):
            return np.clip(np.zeros_like(like), space.low, space.high).astype(like.dtype)
        if isinstance(space, gym.spaces.Discrete):
            return np.asarray(space.start, like.dtype)
        return np.zeros_like(like)

    def step(self, action: Any) -> StepResult:
        action = np.asarray(action)
        lag = delay_steps(self.delay.sample(self._rng, self.num_envs), self.dt_ms)
        applied = []
        for i, q in enumerate(self._queues):
            t = int(self._t[i])
            q.append((t, t + int(lag[i]), np.array(action[i], copy=True)))
            arrived = [j for j, (_, arrival, _) in enumerate(q) if arrival <= t]
            if arrived:
                newest = arrived[-1]
                self.applied_index[i] = q[newest][0]
                self._current[i] = q[newest][2]
                for _ in range(newest + 1):
                    q.popleft()  # the newest arrival supersedes everything decided before it
            applied.append(self._current[i] if self._current[i] is not None else self._fill(i, action[i]))
        res = self.env.step(np.stack(applied))
        done = np.logical_or(res.terminated, res.truncated)
        for i, q in enumerate(self._queues):
            self._previous[i] = applied[i]
            if done[i]:
                q.clear()  # nothing decided in this episode reaches the next one
                self._current[i] = None
                self._t[i] = 0
            else:
                self._t[i] += 1
        self.last_applied = np.stack(applied)
        return res


def link_config(link: LinkConfig | Mapping[str, Any]) -> LinkConfig:
    """A validated :class:`~rlinf_nb.link.LinkConfig` (a mapping's errors name ``link.<key>``)."""
    return link if isinstance(link, LinkConfig) else build(LinkConfig, link, path="link")


def apply_link(env: VecEnv, link: LinkConfig | Mapping[str, Any] | None, seed: int | None = None) -> Any:
    """``env`` with the observation and action delays of ``link`` (returned unchanged when they are all 0).

    ``link``: a :class:`~rlinf_nb.link.LinkConfig` or its mapping (validated; errors name ``link.<key>``).
    """
    if link is None:
        return env
    link = link_config(link)
    if not link.enabled:
        return env
    if not link.action_delay.is_zero:
        env = ActionDelay(env, link.action_delay, link.dt_ms, fill=link.action_fill, seed=seed)
    if not link.obs_delay.is_zero:
        env = ObsDelay(env, link.obs_delay, link.dt_ms, seed=seed)
    return env

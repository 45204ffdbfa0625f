"""A single-process off-policy training loop (no Ray): one gymnasium env, one learner.

For learning tests, benchmarks and notebooks that want SAC/CrossQ/RLPD without a cluster.
The distributed runtime runs the same learner (:mod:`.sac`) behind its stages instead.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlinf_nb import tree

from .registry import get_algorithm
from .sac import OffPolicyConfig, sac_policy_kwargs

__all__ = ["OffPolicyResult", "train_offpolicy"]


@dataclass
class OffPolicyResult:
    """What :func:`train_offpolicy` did.

    Attributes:
        env_steps: env steps taken.
        wall_time_s: seconds spent in the loop.
        episode_returns: the return of every finished training episode, in order.
        reached_at: env step at which the running mean of the last ``window`` episode
            returns first reached ``target_return`` (``None`` if never).
        metrics: the latest value of each learner metric (actor metrics can skip updates under ``policy_delay``).
        learner: the trained learner (its ``policy`` is the actor).
    """

    env_steps: int
    wall_time_s: float
    episode_returns: list[float]
    reached_at: int | None
    metrics: dict[str, float] = field(default_factory=dict)
    learner: Any = None

    def return_mean(self, window: int = 10) -> float:
        tail = self.episode_returns[-window:]
        return float(np.mean(tail)) if tail else float("nan")


def train_offpolicy(
    algorithm: str,
    env_id: str | gym.Env = "Pendulum-v1",
    total_steps: int = 20_000,
    cfg: OffPolicyConfig | None = None,
    seed: int = 0,
    target_return: float | None = None,
    window: int = 10,
    policy_hidden_sizes: tuple[int, ...] = (256, 256),
    demos: Mapping[str, np.ndarray] | None = None,
    on_episode: Callable[[int, float], None] | None = None,
    policy: str = "mlp",
    policy_kwargs: Mapping[str, Any] | None = None,
) -> OffPolicyResult:
    """Train ``algorithm`` (``"sac"``, ``"crossq"`` or ``"rlpd"``) on one env.

    Takes uniform random actions for ``cfg.random_steps`` steps, then samples from the actor;
    after every env step the learner appends the transition and runs ``cfg.utd`` gradient
    steps per transition. Time-limit truncations bootstrap (``terminated`` is stored
    separately). Stops after ``total_steps`` env steps, or as soon as the mean return of
    the last ``window`` episodes reaches ``target_return``. ``demos`` (transition arrays)
    go to the demo buffer of an RLPD learner.

    ``env_id`` may be an env instance (closed at the end). The actor is ``make_policy(policy,
    ...)`` with ``policy_kwargs`` (default: :func:`sac_policy_kwargs` of ``policy_hidden_sizes``
    for ``"mlp"``); dict observations (``policy="cnn"``) work as flat ones.
    """
    from rlinf_nb.policies import make_policy

    algo = get_algorithm(algorithm)
    cfg = cfg if cfg is not None else algo.config_cls()
    torch.manual_seed(seed)
    env = gym.make(env_id) if isinstance(env_id, str) else env_id
    env.action_space.seed(seed)
    if policy_kwargs is None:
        policy_kwargs = sac_policy_kwargs(policy_hidden_sizes) if policy == "mlp" else {}
    actor = make_policy(policy, env.observation_space, env.action_space, **policy_kwargs)
    learner = algo.make_learner(actor, cfg, seed=seed)
    if demos is not None:
        learner.add_demos(demos)
    obs, _ = env.reset(seed=seed)
    returns: list[float] = []
    recent: deque[float] = deque(maxlen=window)
    ep_return, reached_at, metrics = 0.0, None, {}
    start = time.perf_counter()
    step = 0
    for step in range(1, total_steps + 1):
        if step <= cfg.random_steps:
            action = env.action_space.sample()
        else:
            with torch.no_grad():
                action = actor.sample(tree.map(_as_batch, obs))[0][0].numpy()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        out = learner.update(
            {"obs": tree.map(_lead, obs), "actions": np.asarray(action)[None], "rewards": np.array([reward]),
             "next_obs": tree.map(_lead, next_obs), "terminated": np.array([terminated])},
            cfg,
        )  # fmt: skip
        if out.get("updates", 0) > 0:
            metrics = {**metrics, **out}
        ep_return += float(reward)
        obs = next_obs
        if terminated or truncated:
            returns.append(ep_return)
            recent.append(ep_return)
            if on_episode is not None:
                on_episode(step, ep_return)
            ep_return = 0.0
            obs, _ = env.reset()
            if target_return is not None and len(recent) == window and np.mean(recent) >= target_return:
                reached_at = step
                break
    env.close()
    return OffPolicyResult(step, time.perf_counter() - start, returns, reached_at, metrics, learner)


def _lead(x: Any) -> np.ndarray:
    return np.asarray(x)[None]


def _as_batch(x: Any) -> torch.Tensor:
    """One observation leaf as a batch of one: ``uint8`` images stay ``uint8``, the rest float32."""
    a = np.asarray(x)[None]
    return torch.as_tensor(a) if a.dtype == np.uint8 else torch.as_tensor(a, dtype=torch.float32)

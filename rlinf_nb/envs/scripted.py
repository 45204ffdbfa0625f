"""Scripted policies shipped with the package, and demo episodes recorded from them.

A scripted policy maps a batch of state observations to actions with no learning: a
reference for tests and a source of demonstrations for RLPD (``algo.demos: scripted:<n>``).

* ``PushCube-v1`` (ManiSkill, ``obs_mode="state"``, ``control_mode="pd_ee_delta_pos"``): a
  proportional controller on the tool centre point (TCP). It closes the gripper, moves the
  TCP above a point behind the cube (on the side away from the goal), lowers it to the
  cube's height and pushes the cube toward the goal.
* ``PickCube-v1`` (same modes): open gripper over the cube, down, close, then carry the grasped
  cube to the goal (success in every one of 174 episodes of 16 seeded envs; ~18 steps each).
* ``PegInsertionSide-v1`` (state obs, ``pd_ee_delta_pose``): grasp the peg from above, line it up with
  the hole's axis in front of the box, push it in (34 of 40 episodes from seed 7, 20 of 20 from
  seed 0; ~55-60 steps each). It lives with the task's geometry in :mod:`.peg_insertion`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlinf_nb.config import ConfigError

from .peg_insertion import peginsertion_policy

__all__ = [
    "SCRIPTED_POLICIES",
    "ScriptedExpert",
    "demo_transitions",
    "peginsertion_policy",
    "pickcube_policy",
    "pushcube_policy",
    "scripted_episodes",
]

# PushCube-v1 state layout (35 dims): qpos 0:9, qvel 9:18, tcp pose 18:25, goal pos 25:28, cube pose 28:35.
_TCP, _GOAL, _CUBE = slice(18, 21), slice(25, 28), slice(28, 31)
_HALF = 0.02  # PushCube's cube half size (m)


def pushcube_policy(obs: np.ndarray, gain: float = 10.0) -> np.ndarray:
    """Actions ``float32 [N, 4]`` (TCP delta xyz, gripper) for PushCube state observations ``[N, 35]``.

    ``pd_ee_delta_pos`` maps an action of 1 to 0.1 m, so ``gain=10`` closes the whole gap in
    one step (clipped to the action bounds).
    """
    obs = np.asarray(obs, dtype=np.float32).reshape(-1, 35)
    tcp, goal, cube = obs[:, _TCP], obs[:, _GOAL], obs[:, _CUBE]
    direction = goal[:, :2] - cube[:, :2]
    direction /= np.maximum(np.linalg.norm(direction, axis=1, keepdims=True), 1e-6)
    behind = cube.copy()
    behind[:, :2] -= direction * (_HALF + 0.015)
    # How far the TCP is from the push line behind the cube (sideways) and whether it is in front.
    rel = tcp[:, :2] - cube[:, :2]
    along = np.sum(rel * direction, axis=1)
    across = np.linalg.norm(rel - along[:, None] * direction, axis=1)
    aligned = (along < -_HALF) & (across < 0.01)
    low = np.abs(tcp[:, 2] - cube[:, 2]) < 0.01
    target = behind.copy()
    target[:, 2] = np.where(aligned, cube[:, 2], cube[:, 2] + 0.05)  # come from above, then go down
    pushing = aligned & low
    push_to = goal.copy()
    push_to[:, :2] -= direction * _HALF * 0.5
    push_to[:, 2] = cube[:, 2]
    target = np.where(pushing[:, None], push_to, target)
    action = np.zeros((len(obs), 4), np.float32)
    action[:, :3] = np.clip(gain * (target - tcp), -1.0, 1.0)
    action[:, 3] = -1.0  # gripper closed: a flat pushing surface
    return action


# PickCube-v1 state layout (42 dims): qpos 0:9, qvel 9:18, is_grasped 18, tcp pose 19:26, goal pos 26:29,
# cube pose 29:36, tcp-to-cube 36:39, cube-to-goal 39:42.
_PICK_GRASPED, _PICK_TCP, _PICK_GOAL, _PICK_CUBE = 18, slice(19, 22), slice(26, 29), slice(29, 32)


def pickcube_policy(obs: np.ndarray, gain: float = 10.0) -> np.ndarray:
    """Actions ``float32 [N, 4]`` (TCP delta xyz, gripper: 1 open, -1 closed) for PickCube state obs ``[N, 42]``.

    Stateless: the TCP goes 5 cm above the cube with the gripper open, down to the cube's centre, closes
    there, and once the cube is grasped carries it to the goal (a failed grasp starts over from above).
    """
    obs = np.asarray(obs, dtype=np.float32).reshape(-1, 42)
    grasped = obs[:, _PICK_GRASPED] > 0.5
    tcp, goal, cube = obs[:, _PICK_TCP], obs[:, _PICK_GOAL], obs[:, _PICK_CUBE]
    over_cube = np.linalg.norm(tcp[:, :2] - cube[:, :2], axis=1) <= 0.01
    target = cube.copy()
    target[:, 2] = np.where(over_cube, cube[:, 2], cube[:, 2] + 0.05)  # come from above, then go down
    at_cube = np.linalg.norm(tcp - cube, axis=1) < 0.01
    target = np.where(grasped[:, None], goal, target)
    action = np.zeros((len(obs), 4), np.float32)
    action[:, :3] = np.clip(gain * (target - tcp), -1.0, 1.0)
    action[:, 3] = np.where(grasped | at_cube, -1.0, 1.0)
    return action


@dataclass(frozen=True)
class ScriptedExpert:
    """A scripted policy and what it needs."""

    policy: Callable[[np.ndarray], np.ndarray]  # plain state obs [N, D] -> actions [N, A]
    env_kwargs: dict[str, Any]  # env kwargs it needs (obs and control modes)
    arm_dims: slice  # the action dims that move the arm (demo noise goes there, not on the gripper)


SCRIPTED_POLICIES: dict[str, ScriptedExpert] = {
    "maniskill:PushCube-v1": ScriptedExpert(
        pushcube_policy, {"obs_mode": "state", "control_mode": "pd_ee_delta_pos"}, slice(0, 3)
    ),
    "maniskill:PickCube-v1": ScriptedExpert(
        pickcube_policy, {"obs_mode": "state", "control_mode": "pd_ee_delta_pos"}, slice(0, 3)
    ),
    "maniskill:PegInsertionSide-v1": ScriptedExpert(
        peginsertion_policy, {"obs_mode": "state", "control_mode": "pd_ee_delta_pose"}, slice(0, 6)
    ),
}


def scripted_episodes(
    env_id: str, episodes: int, seed: int = 0, successful_only: bool = True, max_tries: int | None = None,
    action_noise: Sequence[float] = (), progress: Callable[[int, int], None] | None = None, **env_kwargs: Any,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:  # fmt: skip
    """Transitions of ``episodes`` episodes of the scripted policy of ``env_id`` (one env, seeded).

    Returns ``(transitions, stats)``: ``obs``, ``actions``, ``rewards``, ``next_obs`` (the true
    last observation at an episode's end), ``terminated``, ``done`` (the episode's last step) and
    ``success`` (the last step of a successful episode), each ``[n, ...]``; ``stats`` has
    ``episodes``, ``tried`` and ``success_rate`` (over the episodes tried). With
    ``successful_only``, failed episodes are dropped and more are played, up to ``max_tries``
    (default ``3 * episodes``).

    ``action_noise`` (DART-style demos): each episode draws one standard deviation from this list and
    the env is stepped with Gaussian noise of that size on the arm's action dims (clipped to the action
    bounds), while ``actions`` records the expert's clean action for each observed state. A cloned
    policy then learns how to come back from the states its own errors lead to.

    With ``obs_features`` among the env kwargs, ``obs`` holds the featured observations and the
    expert acts on the plain state inside them.

    ``progress(kept, episodes)`` is called after every episode kept (a progress bar or a run's setup
    report: 200 PegInsertionSide episodes take minutes).
    """
    from rlinf_nb.envs import make_env

    if env_id not in SCRIPTED_POLICIES:
        raise ValueError(f"no scripted policy for {env_id!r}; scripted envs: {', '.join(SCRIPTED_POLICIES)}")
    expert = SCRIPTED_POLICIES[env_id]
    for key, value in expert.env_kwargs.items():
        if env_kwargs.get(key, value) != value:
            raise ValueError(
                f"the scripted policy of {env_id!r} needs {key}={value!r}, got {env_kwargs[key]!r}"
            )
    noise = np.asarray(action_noise, np.float64)
    if (noise < 0).any() or not np.isfinite(noise).all():
        raise ValueError(
            f"action_noise: got {list(action_noise)}; standard deviations must be finite and >= 0"
        )
    rng = np.random.default_rng([seed, 0xDA27])
    env = make_env(env_id, 1, seed=seed, **{**env_kwargs, **expert.env_kwargs})
    plain = getattr(env, "raw_state", lambda o: o)
    max_tries = max_tries if max_tries is not None else 3 * episodes
    kept: list[dict[str, list]] = []
    tried = successes = 0
    obs = env.reset()
    keys = ("obs", "actions", "rewards", "next_obs", "terminated", "done", "success")
    ep: dict[str, list] = {k: [] for k in keys}
    std = rng.choice(noise) if len(noise) else 0.0
    try:
        while len(kept) < episodes and tried < max_tries:
            action = expert.policy(plain(obs))
            applied = action
            if std > 0:
                applied = action.copy()
                applied[:, expert.arm_dims] += rng.normal(size=applied[:, expert.arm_dims].shape) * std
                applied = np.clip(applied, env.action_space.low, env.action_space.high)
            res = env.step(applied)
            done = bool(res.terminated[0] or res.truncated[0])
            success = done and bool(res.successes[0]) if res.successes else False
            next_obs = res.final_obs if done else res.obs
            for key, value in (("obs", obs[0]), ("actions", action[0]), ("rewards", res.reward[0]),
                               ("next_obs", next_obs[0]), ("terminated", res.terminated[0]),
                               ("done", done), ("success", success)):  # fmt: skip
                ep[key].append(value)
            obs = res.obs
            if done:
                tried += 1
                successes += success
                if success or not successful_only:
                    kept.append(ep)
                    if progress is not None:
                        progress(len(kept), episodes)
                ep = {k: [] for k in keys}
                std = rng.choice(noise) if len(noise) else 0.0
    finally:
        env.close()
    if not kept:
        raise RuntimeError(f"the scripted policy of {env_id!r} succeeded in none of {tried} episodes")
    out = {k: np.concatenate([np.asarray(e[k]) for e in kept]) for k in keys}
    for key in ("terminated", "done", "success"):
        out[key] = out[key].astype(bool)
    return out, {
        "episodes": float(len(kept)),
        "tried": float(tried),
        "success_rate": successes / max(1, tried),
    }


def demo_transitions(
    spec: str, env_cfg: Mapping[str, Any], seed: int = 0, progress: Callable[[int, int], None] | None = None
) -> tuple[dict[str, np.ndarray], dict]:
    """The demo transitions named by ``spec`` for the run's env (``env_cfg``: the run's ``env`` section).

    ``"scripted:<n>"``: ``n`` successful episodes of the env's scripted policy, seeded apart from
    the run's own envs. ``progress``: see :func:`scripted_episodes`.
    """
    kind, _, arg = spec.partition(":")
    if kind != "scripted" or not arg.isdigit() or int(arg) < 1:
        raise ConfigError("algo.demos", spec, "expected 'scripted:<n>' with n >= 1 episodes")
    kwargs = dict(env_cfg.get("kwargs") or {})
    kwargs.pop("render_mode", None)
    return scripted_episodes(env_cfg["id"], int(arg), seed=seed + 1_000_003, progress=progress, **kwargs)

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
  seed 0; ~55-60 steps each).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rlinf_nb.config import ConfigError

from . import quaternion as Q

__all__ = [
    "SCRIPTED_POLICIES",
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


# PegInsertionSide-v1 state layout (43 dims): qpos 0:9, qvel 9:18, tcp pose 18:25, peg pose 25:32, peg half
# size 32:35 (half length, radius, radius), box hole pose 35:42 (x: the hole's axis), hole radius 42.
_TOP_DOWN = np.array([0.0, 1.0, 0.0, 0.0])  # the TCP pointing down with its x along the world's (pi about x)
_STANDOFF = 0.04  # the peg's head lines up this far in front of the hole before going in (m)


def peginsertion_policy(obs: np.ndarray) -> np.ndarray:
    """Actions ``float32 [N, 7]`` (``pd_ee_delta_pose``: TCP delta xyz, delta rotation, gripper) for
    PegInsertionSide state obs ``[N, 43]``.

    Stateless: grasp the peg from above, halfway between its centre and its tail, fingers across it; once
    held, move it so that it lies on the hole's axis with the hole's orientation, its head ``_STANDOFF``
    in front of the box, and push it in 12 mm per step while it stays on the axis (it backs out to line
    up again when it does not). The peg-in-TCP pose is read from each observation, so a peg that slipped
    in the fingers is still steered right. Gains above 1 offset the arm controller's lag (it covers about
    40% of a commanded delta per step); holes have 3 mm of clearance.
    """
    obs = np.asarray(obs, dtype=np.float64).reshape(-1, 43)
    n = len(obs)
    tcp_p, tcp_q, peg_p, peg_q = obs[:, 18:21], obs[:, 21:25], obs[:, 25:28], obs[:, 28:32]
    half_len, hole_p, hole_q, radius = obs[:, 32], obs[:, 35:38], obs[:, 38:42], obs[:, 42]
    width = obs[:, 7] + obs[:, 8]  # between the fingers
    peg_x, hole_x = Q.rotate(peg_q, [1.0, 0.0, 0.0]), Q.rotate(hole_q, [1.0, 0.0, 0.0])

    # grasp from above: TCP over the grasp point and turned to it, then down, then close
    grasp_p = peg_p - peg_x * (0.5 * half_len)[:, None]
    yaw = np.arctan2(peg_x[:, 1], peg_x[:, 0])
    tcp_x = Q.rotate(tcp_q, [1.0, 0.0, 0.0])
    yaw = np.where(tcp_x[:, 0] * np.cos(yaw) + tcp_x[:, 1] * np.sin(yaw) < 0, yaw + np.pi, yaw)  # nearer way
    grasp_q = Q.mul(Q.yaw_quat(yaw), np.broadcast_to(_TOP_DOWN, (n, 4)))
    off = tcp_p - peg_p
    off_axis = np.linalg.norm(off - (off * peg_x).sum(1, keepdims=True) * peg_x, axis=1)
    holding = (off_axis < radius + 0.01) & (width < 2 * radius + 0.006)
    over = (np.linalg.norm(tcp_p[:, :2] - grasp_p[:, :2], axis=1) < 0.008) & (
        Q.angle(Q.mul(grasp_q, Q.conj(tcp_q))) < 0.08
    )
    at_grasp = np.linalg.norm(tcp_p - grasp_p, axis=1) < 0.01
    target_p = np.where(over[:, None], grasp_p, grasp_p + [0.0, 0.0, 0.06])

    # held: the peg onto the hole's axis and orientation, then in
    rel_q = Q.mul(Q.conj(tcp_q), peg_q)  # the peg in the TCP's frame
    rel_p = Q.rotate(Q.conj(tcp_q), peg_p - tcp_p)
    seated = hole_p - hole_x * half_len[:, None]  # the peg's centre with its head at the hole's centre
    d = peg_p - seated
    along = (d * hole_x).sum(1)
    lateral = np.linalg.norm(d - along[:, None] * hole_x, axis=1)
    tilt = Q.angle(Q.mul(hole_q, Q.conj(peg_q)))
    start = -(half_len + _STANDOFF)
    head_in = ((peg_p + peg_x * half_len[:, None] - hole_p) * hole_x).sum(1) > -(half_len + 0.003)
    inserting = (
        ((lateral < 0.0015) & (tilt < 0.012))
        | ((along > start + 0.004) & (lateral < 0.003) & (tilt < 0.04))  # on its way in: a looser band
        | (head_in & (lateral < 0.004))
    )
    peg_target = seated + hole_x * np.where(inserting, np.minimum(along + 0.012, 0.02), start)[:, None]
    hold_q = Q.mul(hole_q, Q.conj(rel_q))
    hold_p = peg_target - Q.rotate(hold_q, rel_p)
    target_p = np.where(holding[:, None], hold_p, target_p)
    target_q = np.where(holding[:, None], hold_q, grasp_q)

    gain = np.where(holding, np.where(inserting, 2.0, 2.5), 1.0)[:, None]
    action = np.zeros((n, 7), np.float32)
    action[:, :3] = np.clip(gain * (target_p - tcp_p) / 0.1, -1.0, 1.0)  # an action of 1 is 0.1 m
    # an action of 1 is 0.1 rad; measured: a positive one turns the TCP the negative way about that world axis
    action[:, 3:6] = np.clip(-gain * Q.rotvec(Q.mul(target_q, Q.conj(tcp_q))) / 0.1, -1.0, 1.0)
    action[:, 6] = np.where(at_grasp | holding, -1.0, 1.0)
    return action


SCRIPTED_POLICIES: dict[str, tuple[Callable[[np.ndarray], np.ndarray], dict[str, Any]]] = {
    # env id -> (policy, env kwargs it needs)
    "maniskill:PushCube-v1": (pushcube_policy, {"obs_mode": "state", "control_mode": "pd_ee_delta_pos"}),
    "maniskill:PickCube-v1": (pickcube_policy, {"obs_mode": "state", "control_mode": "pd_ee_delta_pos"}),
    "maniskill:PegInsertionSide-v1": (
        peginsertion_policy,
        {"obs_mode": "state", "control_mode": "pd_ee_delta_pose"},
    ),
}


def scripted_episodes(
    env_id: str, episodes: int, seed: int = 0, successful_only: bool = True, max_tries: int | None = None,
    **env_kwargs: Any,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:  # fmt: skip
    """Transitions of ``episodes`` episodes of the scripted policy of ``env_id`` (one env, seeded).

    Returns ``(transitions, stats)``: ``obs``, ``actions``, ``rewards``, ``next_obs`` (the true
    last observation at an episode's end) and ``terminated``, each ``[n, ...]``; ``stats`` has
    ``episodes``, ``tried`` and ``success_rate`` (over the episodes tried). With
    ``successful_only``, failed episodes are dropped and more are played, up to ``max_tries``
    (default ``3 * episodes``).
    """
    from rlinf_nb.envs import make_env

    if env_id not in SCRIPTED_POLICIES:
        raise ValueError(f"no scripted policy for {env_id!r}; scripted envs: {', '.join(SCRIPTED_POLICIES)}")
    policy, needed = SCRIPTED_POLICIES[env_id]
    for key, value in needed.items():
        if env_kwargs.get(key, value) != value:
            raise ValueError(
                f"the scripted policy of {env_id!r} needs {key}={value!r}, got {env_kwargs[key]!r}"
            )
    env = make_env(env_id, 1, seed=seed, **{**env_kwargs, **needed})
    max_tries = max_tries if max_tries is not None else 3 * episodes
    kept: list[dict[str, list]] = []
    tried = successes = 0
    obs = env.reset()
    ep: dict[str, list] = {k: [] for k in ("obs", "actions", "rewards", "next_obs", "terminated")}
    try:
        while len(kept) < episodes and tried < max_tries:
            action = policy(obs)
            res = env.step(action)
            done = bool(res.terminated[0] or res.truncated[0])
            next_obs = res.final_obs if done else res.obs
            for key, value in (("obs", obs[0]), ("actions", action[0]), ("rewards", res.reward[0]),
                               ("next_obs", next_obs[0]), ("terminated", res.terminated[0])):  # fmt: skip
                ep[key].append(value)
            obs = res.obs
            if done:
                tried += 1
                success = bool(res.successes[0]) if res.successes else False
                successes += success
                if success or not successful_only:
                    kept.append(ep)
                ep = {k: [] for k in ep}
    finally:
        env.close()
    if not kept:
        raise RuntimeError(f"the scripted policy of {env_id!r} succeeded in none of {tried} episodes")
    out = {k: np.concatenate([np.asarray(e[k]) for e in kept]) for k in kept[0]}
    out["terminated"] = out["terminated"].astype(bool)
    return out, {
        "episodes": float(len(kept)),
        "tried": float(tried),
        "success_rate": successes / max(1, tried),
    }


def demo_transitions(
    spec: str, env_cfg: Mapping[str, Any], seed: int = 0
) -> tuple[dict[str, np.ndarray], dict]:
    """The demo transitions named by ``spec`` for the run's env (``env_cfg``: the run's ``env`` section).

    ``"scripted:<n>"``: ``n`` successful episodes of the env's scripted policy, seeded apart from
    the run's own envs.
    """
    kind, _, arg = spec.partition(":")
    if kind != "scripted" or not arg.isdigit() or int(arg) < 1:
        raise ConfigError("algo.demos", spec, "expected 'scripted:<n>' with n >= 1 episodes")
    kwargs = dict(env_cfg.get("kwargs") or {})
    kwargs.pop("render_mode", None)
    return scripted_episodes(env_cfg["id"], int(arg), seed=seed + 1_000_003, **kwargs)

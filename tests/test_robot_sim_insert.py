"""The insert task on the ``sim`` driver: a peg held by the Panda's hand and a socket on the table.

The task asks the scene for ``hole`` and ``peg`` before it connects, so ``robot:sim_panda/insert``
builds them (other tasks' scenes are unchanged). One env (and its scene) is shared by the module.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from rlinf_nb.robots import RobotError, SpecError, make_robot

import rlinf_nb as rl
from rlinf_nb.envs.human import expert_action
from rlinf_nb.envs.robot_env import RobotEnv

pytest.importorskip("mani_skill")


@pytest.fixture(scope="module")
def env():
    env = RobotEnv("sim_panda", "insert")
    yield env
    env.close()


def _drive_tip(env: RobotEnv, target: np.ndarray, steps: int) -> list[tuple[float, float, dict]]:
    """Move the peg tip toward ``target`` (full ee steps, proportional): (reward, tip z, info) per step."""
    out = []
    for _ in range(steps):
        tip = env.task.scene.position("peg")
        action = np.clip((target - tip) / env.config.max_ee_step, -1, 1)
        _, reward, terminated, _, info = env.step(action)
        out.append((reward, float(env.task.scene.position("peg")[2]), info))
        if terminated:
            break
    return out


def test_make_env_insert_passes_the_gymnasium_env_checker():
    # one reward type only: the checker takes ~12 s on a sim env; sparse differs only in the reward value
    vec = rl.make_env("robot:sim_panda/insert", seed=0)
    inner = vec.envs[0].unwrapped
    assert isinstance(inner, RobotEnv) and inner.observation_space.shape == (7 + 3 + 9,)
    assert {"hole", "peg"} <= set(inner.task.scene.object_names)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(inner)
    vec.close()


def test_the_peg_hangs_from_the_hand_and_the_hole_is_placed(env):
    obs, _ = env.reset(seed=3)
    cfg = env.arm.inner.device.config
    tip, ee = env.task.scene.position("peg"), env.arm.ee_position()
    np.testing.assert_allclose(tip, ee - [0.0, 0.0, cfg.peg_gap + cfg.peg_length], atol=2e-3)
    np.testing.assert_allclose(env.task.scene.position("hole"), env.task.hole, atol=1e-9)
    np.testing.assert_allclose(obs[-9:-6], env.task.hole, atol=1e-6)
    with pytest.raises(RobotError, match="the peg is held by the hand"):
        env.task.scene.place("peg", np.zeros(3))
    with pytest.raises(SpecError, match=r"built 0.05 m tall \(devices.sim.config.objects.hole z\)"):
        env.task.scene.place("hole", np.array([0.4, 0.0, 0.08]))


def test_dense_reward_rises_as_the_peg_enters_the_hole(env):
    env.reset(seed=1)
    hole = env.task.hole
    above = _drive_tip(env, hole + [0.0, 0.0, 0.03], 25)
    assert not any(info["success"] for _, _, info in above)
    depth = env.task.config.depth
    inside = _drive_tip(env, hole - [0.0, 0.0, depth + 0.002], 15)  # down to the required depth
    rewards = [above[0][0], above[-1][0]] + [r for r, _, _ in inside]
    assert rewards[1] > rewards[0] + 0.05  # aligned above the hole beats the start
    descent = [r for r, _, _ in inside]
    assert all(b >= a - 0.002 for a, b in zip(descent, descent[1:], strict=False)), descent
    assert inside[-1][2]["success"] and inside[-1][1] <= hole[2] - depth
    assert descent[-1] > rewards[1]


def test_sparse_reward_is_zero_until_the_peg_is_in(env):
    sparse = RobotEnv(env.robot, "insert", reward="sparse")
    sparse.reset(seed=2)
    hole = sparse.task.hole
    steps = _drive_tip(sparse, hole + [0.0, 0.0, 0.03], 25) + _drive_tip(sparse, hole - [0.0, 0.0, 0.04], 10)
    rewards = [r for r, _, _ in steps]
    assert steps[-1][2]["success"] and rewards[-1] == 1.0
    assert rewards[:-1] and all(r == 0.0 for r in rewards[:-1])


def test_the_socket_blocks_a_misaligned_peg(env):
    env.reset(seed=4)
    hole = env.task.hole
    off = hole + [0.03, 0.0, 0.0]  # on the block's wall, beside the hole
    _drive_tip(env, off + [0.0, 0.0, 0.03], 25)
    steps = _drive_tip(env, off - [0.0, 0.0, 0.04], 12)
    assert min(z for _, z, _ in steps) > hole[2] - 0.005  # the wall holds it up (a few mm of give)
    assert not any(info["success"] for _, _, info in steps)
    assert steps[-1][2]["misalignment"] > env.task.config.tolerance


def test_the_scripted_expert_inserts_the_peg(env):
    wins = 0
    for seed in range(5):
        env.reset(seed=100 + seed)
        for _ in range(env.task.config.max_steps):
            _, _, terminated, truncated, info = env.step(expert_action(env))
            if terminated or truncated:
                break
        wins += bool(info["success"])
    assert wins >= 4, f"the insert expert succeeded in {wins} of 5 seeded episodes"


def test_safety_limits_still_clip_and_keep_the_peg_out():
    # a workspace floor at TCP z = 0.09 keeps the tip (5.5 cm below) 1.5 cm short of the required depth
    env = RobotEnv(
        "sim_panda", "insert", robot_overrides={"components.arm.safety.workspace_low": [0.05, -0.45, 0.09]}
    )
    try:
        env.reset(seed=1)
        hole = env.task.hole
        steps = _drive_tip(env, hole + [0.0, 0.0, 0.03], 25) + _drive_tip(env, hole - [0.0, 0.0, 0.04], 15)
        clipped = {c for _, _, info in steps for c in info["safety_clipped"]}
        assert "workspace" in clipped
        assert not any(info["success"] for _, _, info in steps)
        assert env.arm.ee_position()[2] > 0.09 - 0.004
    finally:
        env.close()


def test_bad_scene_config_names_the_key():
    with pytest.raises(SpecError, match=r"objects\.hole: the hole's top must be above the table"):
        make_robot("sim_panda", {"devices.sim.config.objects": {"hole": [0.4, 0.0, 0.0]}})
    with pytest.raises(SpecError, match="block_half_size .* must exceed peg_half_size"):
        make_robot("sim_panda", {"devices.sim.config.block_half_size": 0.01})
    robot = make_robot("sim_panda")
    with pytest.raises(SpecError, match=r"cannot add object\(s\) \['ball'\]; addable: hole, peg"):
        robot.component("scene").add_objects(["ball"])
    with robot:  # connected: the scene is built, too late to add to it
        with pytest.raises(RobotError, match="already built; disconnect the robot first"):
            robot.component("scene").add_objects(["hole"])
    assert set(robot.component("scene").object_names) == {"puck", "goal", "target"}  # other tasks: no peg

"""RobotEnv: a Robot plus a Task as a gymnasium env, reached through ``make_env("robot:<spec>/<task>")``."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import yaml
from gymnasium.utils.env_checker import check_env
from rlinf_nb.robots import EStopLatchedError, SpecError, make_robot
from rlinf_nb.robots.spec import SPECS_DIR

import rlinf_nb as rl
from rlinf_nb.envs.robot_env import ENV_ID, RobotEnv, TeleopIntervention
from tests.helpers import run_py


def _p(delta: np.ndarray, scale: float = 0.02) -> np.ndarray:
    return np.clip(delta / scale, -1, 1).astype(np.float32)


def reach_policy(obs: np.ndarray) -> np.ndarray:
    return _p(obs[-3:])  # target - ee


def insert_policy(obs: np.ndarray) -> np.ndarray:
    hole, tip = obs[-9:-6], obs[-6:-3]
    if np.linalg.norm((hole - tip)[:2]) > 0.004:  # align above the hole first
        return _p(np.array([hole[0], hole[1], hole[2] + 0.03]) - tip)
    return _p(np.array([hole[0] - tip[0], hole[1] - tip[1], -0.04]))


def push_policy(obs: np.ndarray) -> np.ndarray:
    puck, goal = obs[-9:-6], obs[-6:-3]
    ee = puck - obs[-3:]
    direction = (goal - puck)[:2] / (np.linalg.norm((goal - puck)[:2]) + 1e-9)
    behind = puck[:2] - direction * 0.045
    off = np.linalg.norm(ee[:2] - behind)
    if off > 0.012 and np.dot(ee[:2] - puck[:2], direction) > -0.03:
        target = np.array([*behind, 0.08])  # go round, above the puck
    elif off > 0.012:
        target = np.array([*behind, ee[2]])
    elif ee[2] > 0.03:
        target = np.array([*behind, 0.02])  # down behind it
    else:
        target = np.array([*(goal[:2] - direction * 0.02), 0.02])  # push through
    return _p(target - ee)


POLICIES = {"reach": reach_policy, "push": push_policy, "insert": insert_policy}


def rollout(env: RobotEnv, policy, seed: int):
    obs, info = env.reset(seed=seed)
    rewards, infos = [], []
    while True:
        obs, reward, terminated, truncated, info = env.step(policy(obs))
        rewards.append(reward)
        infos.append(info)
        if terminated or truncated:
            return rewards, infos, terminated


@pytest.mark.parametrize("task", ["reach", "push", "insert"])
@pytest.mark.parametrize("reward", ["dense", "sparse"])
def test_passes_gymnasium_env_checker(task, reward):
    # made through gymnasium (so the checker can also remake it with other render modes)
    env = gym.make(ENV_ID, robot="mock_arm", task=task, reward=reward, render_mode="rgb_array").unwrapped
    assert isinstance(env, RobotEnv)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the checker's warnings count as failures
        check_env(env)
    assert env.render().shape == (64, 64, 3)
    env.close()


@pytest.mark.parametrize(
    "options", [{"obs_mode": "dict", "gripper": True}, {"action_mode": "joint_delta", "max_steps": 5}]
)
def test_env_checker_other_modes(options):
    env = gym.make(ENV_ID, robot="mock_arm", task="reach", **options).unwrapped
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env)
    env.close()


@pytest.mark.parametrize("task", ["reach", "push", "insert"])
def test_scripted_policies_succeed_with_dense_and_sparse_rewards(task):
    for seed in range(3):
        env = RobotEnv("mock_arm", task)
        dense, infos, terminated = rollout(env, POLICIES[task], seed)
        env.close()
        assert terminated and infos[-1]["success"], f"{task} seed {seed}: no success in {len(infos)} steps"
        assert all(not i["success"] for i in infos[:-1])
        assert dense[-1] > dense[0]  # closer at the end than at the start
        env = RobotEnv("mock_arm", task, reward="sparse")
        sparse, infos_s, _ = rollout(env, POLICIES[task], seed)
        env.close()
        assert sparse == [0.0] * (len(sparse) - 1) + [1.0]  # same deterministic episode, sparse reward
        assert len(sparse) == len(dense)


def test_dense_reach_reward_is_minus_distance_and_random_play_truncates():
    env = RobotEnv("mock_arm", "reach", max_steps=7)
    obs, _ = env.reset(seed=1)
    _, reward, _, _, info = env.step(np.zeros(3, np.float32))
    assert reward == pytest.approx(-info["distance"]) and info["distance"] == pytest.approx(
        np.linalg.norm(obs[-3:]), abs=1e-6
    )
    for _ in range(6):
        _, _, terminated, truncated, info = env.step(np.zeros(3, np.float32))
    assert truncated and not terminated and not info["success"]
    env.close()


def test_ee_delta_moves_the_end_effector_by_the_action():
    env = RobotEnv("mock_arm", "reach", max_ee_step=0.01)
    env.reset(seed=0)
    before = env.arm.ee_position()
    env.step(np.array([1.0, -0.5, 0.0], np.float32))
    np.testing.assert_allclose(env.arm.ee_position() - before, [0.01, -0.005, 0.0], atol=1e-3)
    env.close()


def test_safety_clipping_is_reported_in_info():
    env = RobotEnv("mock_arm", "reach", action_mode="joint_delta", max_joint_step=1.0)
    env.reset(seed=0)
    _, _, _, _, info = env.step(np.array([1.0, 0, 0, 0], np.float32))
    assert "max_delta" in info["safety_clipped"]
    env.close()


def test_estop_truncates_and_latches_across_reset():
    env = RobotEnv("mock_arm", "reach")
    env.reset(seed=0)
    env.robot.estop()
    q = env.arm.joint_positions()
    _, _, _, truncated, info = env.step(np.ones(3, np.float32))
    assert truncated and info["estop"] and info["safety_clipped"] == ("estop",)
    np.testing.assert_array_equal(env.arm.joint_positions(), q)
    with pytest.raises(EStopLatchedError, match="clear_estop"):
        env.reset()
    env.robot.clear_estop()
    env.reset(seed=0)
    env.close()


def test_teleop_intervention_replaces_the_agent_action():
    data = yaml.safe_load((SPECS_DIR / "mock_arm.yaml").read_text())
    # the take-over key toggles at poll 1, then 'w' (+x) is held from poll 2
    data["components"]["teleop"]["config"] = {"script": [{"at": 1, "tap": "t"}, {"at": 2, "press": "w"}]}
    env = RobotEnv(make_robot(data), "reach", intervention=TeleopIntervention("teleop"))
    env.reset(seed=0)
    flags, xs = [], []
    for _ in range(5):
        x0 = env.arm.ee_position()[0]
        _, _, _, _, info = env.step(np.array([-1.0, 0.0, 0.0], np.float32))  # the agent pulls back in x
        flags.append(info["intervened"])
        xs.append(env.arm.ee_position()[0] - x0)
    assert flags == [False, False, True, True, True]  # state of the previous tick drives the next step
    assert xs[0] < 0 and xs[1] < 0 and xs[2] == pytest.approx(0.0, abs=1e-6) and xs[3] > 0
    env.robot.disconnect()


def test_make_env_robot_backend():
    vec = rl.make_env("robot:mock_arm/reach", num_envs=2, seed=0)
    assert vec.env_id == "robot:mock_arm/reach" and vec.action_space.shape == (3,)
    obs = vec.reset()
    successes = []
    for _ in range(60):
        result = vec.step(np.stack([reach_policy(o) for o in obs]))
        obs = result.obs
        successes += result.successes
    assert successes and all(s == 1.0 for s in successes)  # via final_info["success"]
    vec.close()
    sparse = rl.make_env(f"robot:{SPECS_DIR / 'mock_arm.yaml'}/insert", reward="sparse")
    assert sparse.observation_space.shape == (4 + 3 + 9,)
    sparse.close()


@pytest.mark.parametrize(
    "spec, kwargs, message",
    [
        ("robot:mock_arm", {}, r"robot env ids are '<spec>/<task>'"),
        ("robot:mock_arm/fly", {}, r"unknown task 'fly'; known tasks: bireach, insert, push, reach"),
        (
            "robot:mock_arm/reach",
            {"rewrd": "sparse"},
            r"unknown option\(s\) \['rewrd'\].*reach task options: .*'reward'",
        ),
        (
            "robot:mock_arm/reach",
            {"reward": "shaped"},
            r"reward: 'shaped' is not a reward type; allowed: 'dense', 'sparse'",
        ),
        ("robot:mock_arm/reach", {"action_mode": "torque"}, r"action_mode: 'torque' is not a mode"),
        ("robot:nope/reach", {}, r"no packaged spec 'nope'"),
    ],
)
def test_make_env_errors(spec, kwargs, message):
    with pytest.raises(ValueError, match=message):
        rl.make_env(spec, **kwargs)


def test_real_robots_are_one_env_and_tasks_need_kinematics():
    with pytest.raises(ValueError, match="one real robot, so num_envs must be 1"):
        rl.make_env("robot:so101/reach", num_envs=2)
    with pytest.raises(SpecError, match="has no forward kinematics"):
        RobotEnv("so101", "reach")


def test_gymnasium_id_works_in_a_fresh_process():
    """Env workers build envs from a gymnasium id; the module:id form imports our module first."""
    proc = run_py(
        "import gymnasium as gym\n"
        f"env = gym.make({ENV_ID!r}, robot='mock_arm', task='push', reward='sparse')\n"
        "obs, info = env.reset(seed=0)\n"
        "print(obs.shape, env.step(env.action_space.sample())[4]['success'])\n",
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "(16,) False"

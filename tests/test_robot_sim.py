"""The ``sim`` driver: a ManiSkill 3 Panda scene as robot components (CPU physics, lavapipe rendering).

One connected ``sim_panda`` robot is shared by the module (ManiSkill's import is ~5 s, a scene
~1 s, and the first camera frame of a process compiles shaders: 5-35 s on the loaded box; later
scenes render their first frame at once while one that has rendered is alive). Each test puts
the arm back at rest first.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest
import yaml
from gymnasium.utils.env_checker import check_env
from rlinf_nb.robots import DriverUnavailableError, NotConnectedError, SpecError, make_robot
from rlinf_nb.robots.drivers import sim as sim_driver
from rlinf_nb.robots.kinematics import dls_step, numeric_jacobian
from rlinf_nb.robots.spec import SPECS_DIR

import rlinf_nb as rl
from rlinf_nb.envs.robot_env import RobotEnv
from tests.test_robot_env import push_policy, reach_policy, rollout

pytest.importorskip("mani_skill")


def _spec(**changes) -> dict:
    data = yaml.safe_load((SPECS_DIR / "sim_panda.yaml").read_text())
    for path, value in changes.items():
        if value is None:
            data["components"].pop(path)
        else:
            data["components"][path] = value
    return data


@pytest.fixture(scope="module")
def sim():
    robot = make_robot("sim_panda")
    robot.connect()
    yield robot
    robot.disconnect()


@pytest.fixture
def robot(sim):
    """The shared robot, at rest, objects at their start, e-stop clear."""
    sim.clear_estop()
    arm = sim.arm()
    arm.teleport(arm.inner.device.rest)
    sim.component("gripper").send([0.0])
    sim.component("scene").reset()
    sim.tick()
    return sim


def _hand_rotation(arm, q):
    return arm.inner.device._tcp_pose(q)[:3, :3]


# -- without a scene ---------------------------------------------------------------------------


def test_features_are_readable_while_disconnected():
    robot = make_robot("sim_panda")
    feats = robot.features()
    assert feats["arm"]["joint_pos"].shape == (7,) and feats["arm"]["joint_pos"].unit == "rad"
    assert feats["arm"]["joint_pos"].names == sim_driver.PANDA_JOINTS
    assert feats["arm"]["joint_pos"].low[3] == pytest.approx(-3.0718)
    assert feats["arm"]["ee_pos"].unit == "m"
    assert feats["gripper"]["pos"].shape == (1,)
    assert feats["cams/front"]["rgb"].shape == (128, 128, 3) and feats["cams/front"]["rgb"].dtype == "uint8"
    assert set(feats["scene"]) == {"puck", "goal", "target"} and feats["scene"]["puck"].unit == "m"
    assert robot.arm().joint_limits.shape == (7, 2)
    with pytest.raises(NotConnectedError, match="arm 'arm': cannot read while disconnected"):
        robot.arm().read()
    with pytest.raises(NotConnectedError, match="sim driver: cannot compute forward kinematics"):
        robot.arm().forward_kinematics(np.zeros(7))
    with pytest.raises(NotConnectedError, match="cams/front"):
        robot.component("cams/front").image()


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"cams/wrist": {"kind": "camera", "driver": "sim", "device": "sim", "config": {"name": "hand"}}},
            "wrist camera of robot panda_wristcam",
        ),
        ({"cams/other": {"kind": "camera", "driver": "sim", "device": "sim"}}, "two cameras with one name"),
        (
            {"cams/front": {"kind": "camera", "driver": "sim", "device": "sim", "config": {"width": 4}}},
            "width/height must be >= 8",
        ),
        ({"arm": {"kind": "arm", "driver": "sim"}}, "needs a device with driver 'maniskill'"),
        (
            {"arm": {"kind": "arm", "driver": "sim", "device": "sim", "config": {"home": [0.0] * 6}}},
            "home: expected 7 joint positions",
        ),
    ],
)
def test_spec_errors_name_the_fix(change, message):
    with pytest.raises(SpecError, match=message):
        make_robot(_spec(**change))


@pytest.mark.parametrize(
    "override, message",
    [
        ({"devices.sim.config.objects": {"ball": [0.3, 0.0, 0.1]}}, r"objects\.ball: unknown object"),
        ({"devices.sim.config.robot": "fetch"}, "robot: 'fetch' is not supported"),
        ({"devices.sim.config.sim_freq": 30}, "must be a positive multiple of control_freq"),
    ],
)
def test_device_config_errors(override, message):
    with pytest.raises(SpecError, match=message):
        make_robot("sim_panda", override)


def test_missing_maniskill_or_a_failed_scene_is_a_clear_error(monkeypatch):
    robot = make_robot(_spec(**{"cams/front": None}))
    monkeypatch.setitem(sys.modules, "mani_skill", None)  # as if not installed
    monkeypatch.setattr(sim_driver, "_scene_class", sim_driver._scene_class.__wrapped__)
    with pytest.raises(
        DriverUnavailableError, match="ManiSkill 3 is not importable.*uv pip install mani-skill"
    ):
        robot.connect()
    assert not any(c.is_connected for c in robot.components().values())
    monkeypatch.undo()

    class Broken:
        def __init__(self, **kwargs):
            raise RuntimeError("failed to find a rendering device")

    monkeypatch.setattr(sim_driver, "_scene_class", lambda: Broken)
    with pytest.raises(DriverUnavailableError, match="could not create the ManiSkill scene.*lavapipe"):
        robot.connect()
    assert not robot.arm().inner.device.is_open


# -- components on the shared scene ------------------------------------------------------------


def test_components_read_the_simulation(robot):
    arm = robot.arm()
    reading = arm.read()
    assert reading["joint_pos"].shape == (7,) and reading["joint_pos"].dtype == np.float32
    q = arm.joint_positions()
    np.testing.assert_allclose(q, arm.inner.device.rest, atol=1e-5)
    # the TCP the simulation reports is where the kinematic model puts it
    np.testing.assert_allclose(reading["ee_pos"], arm.forward_kinematics(q), atol=1e-5)
    # 10 cm "origin" in front of the base: the Panda's rest TCP (0.615 m from its base) reads x ~ 0.515
    assert reading["ee_pos"][0] == pytest.approx(0.515, abs=0.005)
    jp, jr = arm.inner.device.jacobians(q)
    np.testing.assert_allclose(jp, numeric_jacobian(arm.forward_kinematics, q), atol=1e-5)
    # the arm's Jacobian (keep_orientation) moves the TCP without turning the hand
    assert np.abs(jr @ np.linalg.pinv(arm.jacobian(q))).max() < 1e-6
    scene = robot.component("scene").read()
    np.testing.assert_allclose(scene["puck"], [0.35, -0.15, 0.02], atol=2e-3)  # resting on the table
    np.testing.assert_allclose(scene["goal"], [0.45, -0.05, 0.0], atol=1e-6)
    assert robot.component("gripper").read()["pos"][0] < 0.05  # the spec starts it closed


@pytest.mark.parametrize("axis, sign", [(0, -1), (1, 1), (1, -1), (2, 1), (2, -1)])
def test_commanded_ee_moves_go_the_commanded_way(robot, axis, sign):
    arm = robot.arm()
    start = arm.ee_position()
    rot0 = _hand_rotation(arm, arm.joint_positions())
    want = np.zeros(3)
    want[axis] = sign * 0.015
    for _ in range(6):
        q = arm.joint_positions()
        arm.send(q + dls_step(arm.jacobian(q), want))
        robot.tick()
    moved = arm.read()["ee_pos"] - start  # read back from the simulation
    assert sign * moved[axis] > 0.05, moved
    assert np.linalg.norm(np.delete(moved, axis)) < 0.2 * abs(moved[axis]), moved
    turned = np.arccos(
        np.clip((np.trace(rot0.T @ _hand_rotation(arm, arm.joint_positions())) - 1) / 2, -1, 1)
    )
    assert turned < 0.05  # rad: the hand keeps pointing down


def test_gripper_opens_and_closes(robot):
    gripper = robot.component("gripper")
    for opening, check in [(1.0, lambda x: x > 0.9), (0.0, lambda x: x < 0.1)]:
        assert gripper.send([opening])[0] == opening
        for _ in range(8):
            robot.tick()
        assert check(gripper.read()["pos"][0])


def test_safety_limits_apply_to_the_sim_arm(robot):
    arm = robot.arm()
    q = arm.joint_positions()
    sent = arm.send(q + np.array([0, 0, 0, -0.5, 0, 0, 0]))  # joint 4 sits near its lower limit
    assert "max_delta" in arm.last_report.clipped
    assert np.abs(sent - q).max() <= 0.1 + 1e-9
    low = arm.joint_limits[3, 0]
    arm.teleport(np.r_[q[:3], low + 0.02, q[4:]])
    sent = arm.send(np.r_[q[:3], low - 0.5, q[4:]])
    assert "joint_limits" in arm.last_report.clipped and sent[3] >= low
    # the workspace box keeps the TCP above z = 0.015 however hard it is pushed down
    arm.teleport(arm.inner.device.rest)
    clipped = set()
    for _ in range(25):
        q = arm.joint_positions()
        arm.send(q + dls_step(arm.jacobian(q), np.array([0.0, 0.0, -0.03])))
        clipped |= set(arm.last_report.clipped)
        robot.tick()
    assert "workspace" in clipped
    assert arm.read()["ee_pos"][2] > 0.015 - 0.004  # PD overshoot of a few mm at most


def test_estop_holds_the_sim_arm_within_one_step(robot):
    arm = robot.arm()
    for _ in range(3):  # get it moving at the velocity limit
        arm.send(arm.joint_positions() + np.array([0.1, 0, 0, 0, 0, 0, 0.1]))  # swing the base and wrist
        robot.tick()
    at_stop = arm.joint_positions()
    robot.estop("test")
    robot.tick()
    after_one = arm.joint_positions()
    assert np.abs(after_one - at_stop).max() < 0.03  # rad: what its momentum carries in one period
    for _ in range(5):
        sent = arm.send(at_stop + 0.1)  # commands are replaced by "hold"
        assert arm.last_report.clipped == ("estop",)
        robot.tick()
    assert np.abs(arm.joint_positions() - after_one).max() < 0.03
    assert np.abs(sent - arm.joint_positions()).max() < 0.03
    robot.clear_estop()
    before = arm.joint_positions()
    arm.send(before - np.array([0.05, 0, 0, 0, 0, 0, 0]))
    robot.tick()
    assert arm.last_report.clipped == ()
    assert before[0] - arm.joint_positions()[0] > 0.02  # moves again once cleared


def test_watchdog_holds_a_silent_sim_arm(robot):
    arm = robot.arm()
    trips = arm.watchdog_trips
    arm.send(arm.joint_positions() + 0.05)
    for _ in range(12):  # 600 ms of silence at 20 Hz
        robot.tick()
    assert arm.watchdog_trips == trips + 1


def test_reach_and_push_tasks_run_on_the_sim(robot):
    home = list(robot.arm().inner.device.rest)
    for task, policy, seeds in [("reach", reach_policy, range(3)), ("push", push_policy, range(2))]:
        env = RobotEnv(robot, task, home=home)
        for seed in seeds:
            rewards, infos, terminated = rollout(env, policy, seed)
            assert terminated and infos[-1]["success"], (
                f"{task} seed {seed}: no success in {len(infos)} steps"
            )
            assert rewards[-1] > rewards[0]  # push: the fingers pushed the cube 6-12 cm, to within 3 cm
        env.close()
    assert robot.is_connected  # an env does not close a robot it was given


def test_camera_frames_are_images_that_change_when_the_arm_moves(robot):
    cam = robot.component("cams/front")
    frame = cam.image()
    assert frame.shape == (128, 128, 3) and frame.dtype == np.uint8 and frame.std() > 5
    np.testing.assert_array_equal(cam.image(), frame)  # nothing moved, same picture
    arm = robot.arm()
    for _ in range(8):
        q = arm.joint_positions()
        arm.send(q + dls_step(arm.jacobian(q), np.array([0.0, 0.03, -0.01])))
        robot.tick()
    moved = cam.image()
    assert np.abs(moved.astype(int) - frame.astype(int)).mean() > 1.0
    env = RobotEnv(robot, "reach", obs_mode="dict", max_steps=5)
    obs, _ = env.reset(seed=0)
    assert obs["cams/front"].shape == (128, 128, 3) and env.observation_space["cams/front"].contains(
        obs["cams/front"]
    )


def test_wrist_camera_moves_with_the_hand(sim):
    sim.component("cams/front").image()  # a living scene that has rendered keeps the shaders warm
    spec = _spec(
        **{"cams/wrist": {"kind": "camera", "driver": "sim", "device": "sim", "config": {"name": "hand"}}}
    )
    spec["devices"]["sim"]["config"]["robot"] = "panda_wristcam"
    with make_robot(spec) as robot:
        wrist = robot.component("cams/wrist")
        first = wrist.image()
        assert first.shape == (128, 128, 3) and first.std() > 5
        arm = robot.arm()
        arm.teleport(arm.joint_positions() + np.array([0.4, 0, 0, 0, 0, 0, 0]))
        assert np.abs(wrist.image().astype(int) - first.astype(int)).mean() > 1.0


def test_make_env_reach_passes_the_gymnasium_env_checker():
    vec = rl.make_env("robot:sim_panda/reach", seed=0)
    env = vec.envs[0].unwrapped
    assert isinstance(env, RobotEnv) and env.observation_space.shape == (7 + 3 + 6,)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env)
    obs = vec.reset()
    successes = []
    for _ in range(40):
        result = vec.step(np.stack([reach_policy(o) for o in obs]))
        obs = result.obs
        successes += result.successes
    assert successes and all(s == 1.0 for s in successes)
    vec.close()
    assert not env.robot.is_connected  # the env made its robot, so it closed it


def test_robot_check_cli_exits_0(sim, capsys):
    from rlinf_nb.cli import main

    sim.component("cams/front").image()  # keeps the renderer warm for the check's own scene
    assert main(["robot", "check", "sim_panda"]) == 0
    out = capsys.readouterr().out
    assert "healthy" in out and "NOT" not in out and "cams/front  frame 128x128" in out

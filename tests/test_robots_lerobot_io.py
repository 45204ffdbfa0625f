"""LeRobot teleoperators (leader arms, keyboard, gamepad) and OpenCV cameras through LeRobot's own classes.

No hardware: each device's SDK is faked where LeRobot imports it (the motor bus class in the leader
module, pynput's listener in LeRobot's keyboard module, a ``pygame`` module, ``cv2.VideoCapture``),
and the tests assert the exact traffic and the TeleopState / frames that come out.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest
from rlinf_nb.robots import (
    CalibrationRequiredError,
    DriverUnavailableError,
    NotConnectedError,
    RobotError,
    SpecError,
    TeleopState,
    check_robot,
    make_robot,
)
from rlinf_nb.robots.drivers.lerobot_teleop import (
    LeRobotGamepadTeleop,
    LeRobotKeyboardTeleop,
    LeRobotLeaderTeleop,
)
from rlinf_nb.robots.testing import (
    patch_lerobot_bus,
    patch_lerobot_gamepad,
    patch_lerobot_keyboard,
    patch_lerobot_opencv,
    write_calibration_file,
)

from rlinf_nb.envs.human import teleop_arm_action
from rlinf_nb.envs.robot_env import RobotEnv, TeleopIntervention

SO_MOTORS = ["shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper"]
ARM = SO_MOTORS[:5]


def teleop_spec(tmp_path, **config) -> dict:
    return {
        "name": "teleop_test",
        "clock": "sim",
        "components": {
            "teleop": {
                "kind": "teleop",
                "driver": "lerobot",
                "config": {"calibration_dir": str(tmp_path), **config},
            }
        },
    }


def leader_spec(tmp_path, teleop_type="so101_leader", calibrate=True, **config) -> dict:
    if calibrate:
        write_calibration_file(tmp_path, "test_leader", SO_MOTORS)
    return teleop_spec(
        tmp_path, **{"type": teleop_type, "port": "/dev/ttyFAKE1", "id": "test_leader", **config}
    )


def camera_spec(**config) -> dict:
    cfg = {"index_or_path": 0, "width": 64, "height": 48, "fps": 30, "warmup_s": 0, **config}
    return {
        "name": "cam_test",
        "clock": "sim",
        "components": {"cams/wrist": {"kind": "camera", "driver": "lerobot", "config": cfg}},
    }


# -- leader arms -----------------------------------------------------------------------------------


def test_so101_leader_exact_bus_traffic_and_teleop_state(tmp_path):
    from lerobot.motors.feetech import OperatingMode

    start = {"shoulder_pan": 12.5, "elbow_flex": -30.0, "gripper": 40.0}
    with patch_lerobot_bus("so101_leader", start_positions=start) as fake:
        robot = make_robot(leader_spec(tmp_path))
        teleop = robot["teleop"]
        assert isinstance(teleop, LeRobotLeaderTeleop)
        robot.connect()
        bus = fake.bus
        assert bus.port == "/dev/ttyFAKE1"
        # a leader is moved by hand: torque off, position mode, nothing enabled
        assert bus.calls == [("connect",), ("disable_torque", None), ("configure_motors",)] + [
            ("write", "Operating_Mode", m, OperatingMode.POSITION.value) for m in SO_MOTORS
        ]
        del bus.calls[:]
        state = teleop.poll()
        assert bus.calls == [("sync_read", "Present_Position")]
        assert state.joints == {
            "shoulder_pan": 12.5,
            "shoulder_lift": 0.0,
            "elbow_flex": -30.0,
            "wrist_flex": 0.0,
            "wrist_roll": 0.0,
        }
        assert state.gripper == pytest.approx(0.4)  # LeRobot's 0..100
        assert state.action.tolist() == [0.0, 0.0, 0.0] and state.intervene and not state.estop
        bus.positions["wrist_roll"] = 90.0  # the human turns the leader's wrist
        read = teleop.read()
        assert read["joints"].tolist() == [12.5, 0.0, -30.0, 0.0, 90.0] and read["joints"].dtype == np.float32
        assert read["gripper"].tolist() == [pytest.approx(0.4)]
        del bus.calls[:]
        robot.disconnect()
        assert bus.calls == [("disconnect", True)]


def test_leader_features_while_disconnected_and_units():
    so = make_robot(leader_spec("/nonexistent", calibrate=False))["teleop"]
    feats = so.features
    assert feats["joints"].names == tuple(ARM) and feats["joints"].unit == "deg"
    assert feats["gripper"].shape == (1,) and feats["action"].shape == (3,)
    koch = make_robot(leader_spec("/nonexistent", "koch_leader", calibrate=False))["teleop"]
    assert koch.features["joints"].unit == "1"  # the Koch leader reads -100..100
    with pytest.raises(NotConnectedError, match="teleop 'teleop': cannot poll while disconnected"):
        so.poll()


def test_koch_leader_traffic(tmp_path):
    from lerobot.motors.dynamixel import OperatingMode

    with (
        patch_lerobot_bus("koch_leader") as fake,
        make_robot(leader_spec(tmp_path, "koch_leader", intervene=False)) as robot,
    ):
        expected = [("connect",), ("disable_torque", None), ("configure_motors",)]
        expected += [("write", "Operating_Mode", m, OperatingMode.EXTENDED_POSITION.value) for m in ARM]
        expected += [
            ("write", "Operating_Mode", "gripper", OperatingMode.CURRENT_POSITION.value),
            ("enable_torque", "gripper"),  # the leader's gripper springs back: a trigger
            ("write", "Goal_Position", "gripper", 50.0),
        ]
        assert fake.bus.calls == expected
        state = robot["teleop"].poll()
        assert not state.intervene and set(state.joints) == set(ARM)


def test_leader_missing_sdk_port_and_calibration(tmp_path, monkeypatch):
    with patch_lerobot_bus("so101_leader", port_present=False):
        with pytest.raises(
            DriverUnavailableError, match=r"/dev/ttyFAKE1.*plug in the arm's USB cable.*lerobot-find-port"
        ):
            make_robot(leader_spec(tmp_path)).connect()
    with patch_lerobot_bus("so101_leader") as fake:
        with pytest.raises(
            CalibrationRequiredError,
            match=r"lerobot-calibrate --teleop.type=so101_leader --teleop.port=/dev/ttyFAKE1 --teleop.id=other",
        ):
            make_robot(leader_spec(tmp_path, id="other")).connect()
        assert fake.bus.calls == []
    with patch_lerobot_bus("so101_leader", calibrated=False) as fake, make_robot(leader_spec(tmp_path)):
        assert ("write_calibration", sorted(SO_MOTORS)) in fake.bus.calls
    monkeypatch.setitem(sys.modules, "scservo_sdk", None)  # as if `lerobot[feetech]` were not installed
    robot = make_robot(leader_spec(tmp_path))
    with pytest.raises(
        DriverUnavailableError, match=r"install it with `uv pip install 'lerobot\[feetech\]'`"
    ):
        robot.connect()
    assert not robot.is_connected


# -- keyboard --------------------------------------------------------------------------------------


def test_keyboard_keys_to_teleop_state_like_the_mock(tmp_path):
    with patch_lerobot_keyboard() as keys:
        robot = make_robot(teleop_spec(tmp_path, type="keyboard"))
        teleop = robot["teleop"]
        assert isinstance(teleop, LeRobotKeyboardTeleop)
        robot.connect()
        assert keys.listener.calls == ["start"]
        idle = teleop.poll()
        assert idle.action.tolist() == [0.0, 0.0, 0.0] and idle.gripper is None and not idle.intervene
        assert idle.buttons == dict.fromkeys(
            ["estop", "intervene", "open", "close", "success", "failure"], False
        )
        keys.press("w")
        keys.press("d")
        keys.press("r")
        keys.press("t")  # take over: toggles on the press
        state = teleop.poll()
        assert state.action.tolist() == [1.0, -1.0, 1.0] and state.intervene
        assert teleop.poll().intervene  # still held: no second toggle
        keys.release("t")
        keys.release("w")
        keys.press("s")
        keys.press("o")
        state = teleop.poll()
        assert state.action.tolist() == [-1.0, -1.0, 1.0] and state.gripper == 1.0 and state.intervene
        keys.release("o")
        keys.press("c")
        keys.press("y")
        state = teleop.poll()
        assert state.gripper == 0.0 and state.buttons["success"] and not state.buttons["failure"]
        keys.press("t")  # toggles off
        keys.press("space")  # a special key: LeRobot's keyboard drops keys without a character
        assert not teleop.poll().intervene and not teleop.poll().estop
        keys.press("x")  # the e-stop key
        robot.tick()
        assert robot.estopped and "teleop teleop" in robot.estop_latch.reason
        robot.clear_estop()
        keys.release("x")
        keys.press("esc")
        keys.release("esc")  # LeRobot stops its listener on ESC: that reads as the e-stop
        assert keys.listener.calls == ["start", "stop"]
        state = teleop.poll()
        assert state.estop and not state.intervene and state.action.tolist() == [0.0, 0.0, 0.0]
        robot.disconnect()  # the listener is already gone: no second stop
        assert keys.listener.calls == ["start", "stop"]


def test_keyboard_disconnect_stops_the_listener(tmp_path):
    with patch_lerobot_keyboard() as keys, make_robot(teleop_spec(tmp_path, type="keyboard")):
        pass
    assert keys.listener.calls == ["start", "stop"]


def test_keyboard_without_pynput_or_display_says_what_to_do(tmp_path, monkeypatch):
    from lerobot.teleoperators.keyboard import teleop_keyboard

    monkeypatch.setattr(teleop_keyboard, "PYNPUT_AVAILABLE", False)  # what LeRobot's import found
    monkeypatch.setitem(sys.modules, "pynput", None)  # not installed
    with pytest.raises(
        DriverUnavailableError, match=r"needs pynput \(not installed\).*`uv pip install pynput`"
    ):
        make_robot(teleop_spec(tmp_path, type="keyboard")).connect()
    monkeypatch.setitem(sys.modules, "pynput", types.ModuleType("pynput"))  # installed, but headless
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    with pytest.raises(DriverUnavailableError, match=r"pynput needs a display \(DISPLAY is not set\)"):
        make_robot(teleop_spec(tmp_path, type="keyboard")).connect()


# -- gamepad ---------------------------------------------------------------------------------------


def test_gamepad_sticks_buttons_and_events_to_teleop_state(tmp_path):
    with patch_lerobot_gamepad() as pygame:
        robot = make_robot(teleop_spec(tmp_path, type="gamepad"))
        teleop = robot["teleop"]
        assert isinstance(teleop, LeRobotGamepadTeleop)
        robot.connect()
        assert pygame.calls == [("init",), ("joystick.init",), ("Joystick", 0)]
        idle = teleop.poll()
        assert idle.action.tolist() == [0.0, 0.0, 0.0] and idle.gripper is None and not idle.intervene
        pygame.move(1, -0.5)  # left stick up: +x
        pygame.move(0, 0.05)  # inside LeRobot's dead zone
        pygame.move(3, 0.8)  # right stick down: -z
        pygame.press(5)  # RB held: take over
        state = teleop.poll()
        assert state.action.tolist() == pytest.approx([0.5, 0.0, -0.8]) and state.intervene
        assert state.buttons["intervene"] and not state.estop
        pygame.press(7)  # open the gripper
        assert teleop.poll().gripper == 1.0
        pygame.release(7)
        pygame.press(6)
        assert teleop.poll().gripper == 0.0
        pygame.release(6)
        pygame.press(3)  # Y: success, seen once
        state = teleop.poll()
        assert state.buttons["success"] and not state.buttons["failure"] and state.gripper is None
        assert not teleop.poll().buttons["success"]
        pygame.release(3)
        pygame.press(1)  # A: failure
        state = teleop.poll()
        assert state.buttons["failure"] and not state.buttons["rerecord"]
        pygame.release(1)
        pygame.press(0)  # X: rerecord (not a failure mark)
        state = teleop.poll()
        assert state.buttons["rerecord"] and not state.buttons["failure"]
        pygame.release(0)
        pygame.release(5)
        assert not teleop.poll().intervene
        pygame.press(2)  # B: the e-stop
        robot.tick()
        assert robot.estopped
        robot.disconnect()
        assert pygame.calls[-2:] == [("joystick.quit",), ("quit",)]


def test_gamepad_missing_sdk_or_pad(tmp_path, monkeypatch):
    with patch_lerobot_gamepad(count=0) as pygame:
        with pytest.raises(DriverUnavailableError, match=r"no gamepad found.*plug in a gamepad"):
            make_robot(teleop_spec(tmp_path, type="gamepad")).connect()
        assert pygame.calls[-1] == ("quit",)  # LeRobot's pygame session was closed again
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setitem(sys.modules, "pygame", None)
    with pytest.raises(
        DriverUnavailableError, match=r"needs pygame.*install it with `uv pip install 'lerobot\[gamepad\]'`"
    ):
        make_robot(teleop_spec(tmp_path, type="gamepad")).connect()


def test_teleop_config_errors_name_key_value_and_allowed(tmp_path):
    with pytest.raises(
        SpecError, match=r"components.teleop.config: type: 'joystick' is not a LeRobot teleop; allowed: \["
    ):
        make_robot(teleop_spec(tmp_path, type="joystick"))
    with pytest.raises(
        SpecError, match=r"components.teleop.config: port: a so101_leader needs its serial port"
    ):
        make_robot(teleop_spec(tmp_path, type="so101_leader"))
    with pytest.raises(SpecError, match=r"port: '/dev/ttyACM0' given, but a keyboard has no serial port"):
        make_robot(teleop_spec(tmp_path, type="keyboard", port="/dev/ttyACM0"))
    with pytest.raises(SpecError, match=r"estop_button: -1 is not a button index"):
        make_robot(teleop_spec(tmp_path, type="gamepad", estop_button=-1))


# -- OpenCV cameras --------------------------------------------------------------------------------


def test_opencv_camera_exact_capture_traffic_and_frames():
    robot = make_robot(camera_spec(index_or_path=2, fourcc=None))
    cam = robot["cams/wrist"]
    assert cam.features["rgb"].shape == (48, 64, 3) and cam.features["rgb"].dtype == "uint8"
    with patch_lerobot_opencv() as fake:
        robot.connect()
        capture = fake.capture
        assert capture.calls == [
            ("open", 2, 0),  # index, backend ANY
            ("get", "width"),
            ("get", "height"),
            ("set", "width", 64.0),
            ("set", "height", 48.0),
            ("get", "width"),
            ("get", "height"),
            ("set", "fps", 30.0),
            ("get", "fps"),
        ]
        first = cam.read()["rgb"]
        assert first.shape == (48, 64, 3) and first.dtype == np.uint8 and first.flags.c_contiguous
        # RGB from OpenCV's BGR: red is the column, green 100, blue the frame number
        assert first[0, 5].tolist()[:2] == [5, 100] and first[47, 63, 0] == 63
        second = cam.image()
        assert second[0, 0, 2] != first[0, 0, 2]  # a new frame, not the same one again
        del capture.calls[:]
        robot.disconnect()
        assert capture.calls == [("release",)] and not capture.isOpened()


def test_opencv_camera_bgr_rotation_and_path():
    spec = camera_spec(index_or_path="/dev/videoFAKE0", color_mode="bgr", rotation=90, width=48, height=64)
    robot = make_robot(spec)
    assert robot["cams/wrist"].image_shape == (64, 48, 3)
    with patch_lerobot_opencv() as fake, robot:
        assert fake.capture.calls[0] == ("open", Path("/dev/videoFAKE0"), 0)
        assert ("set", "width", 64.0) in fake.capture.calls  # the capture is landscape; rotated after
        frame = robot["cams/wrist"].image()
        assert frame.shape == (64, 48, 3)
        assert frame[0, 0, 1] == 100 and frame[0, 0, 2] == 0  # BGR kept: red is the column channel


def test_check_robot_over_a_fake_camera_is_healthy():
    with patch_lerobot_opencv():
        report = check_robot(camera_spec())
    assert report.ok, report.format()


def test_opencv_camera_missing_device_mode_or_cv2(monkeypatch):
    with patch_lerobot_opencv(present=False) as fake:
        with pytest.raises(
            DriverUnavailableError,
            match=r"cannot open camera '/dev/videoFAKE9': no such device: plug in the camera.*lerobot-find-cameras opencv",
        ):
            make_robot(camera_spec(index_or_path="/dev/videoFAKE9")).connect()
        with pytest.raises(DriverUnavailableError, match=r"cannot open camera 3: it did not open"):
            make_robot(camera_spec(index_or_path=3)).connect()
        assert fake.capture.calls == [("open", 3, 0), ("release",)]
    with patch_lerobot_opencv(sizes=[(640, 480)]) as fake:
        robot = make_robot(camera_spec())
        with pytest.raises(RobotError, match=r"camera 0 does not take 64x48 at 30 fps"):
            robot.connect()
        assert fake.capture.calls[-1] == ("release",) and not robot.is_connected
    for name in ("lerobot.cameras.opencv", "lerobot.cameras.opencv.camera_opencv"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "cv2", None)
    with pytest.raises(
        DriverUnavailableError, match=r"install it with `uv pip install opencv-python-headless`"
    ):
        make_robot(camera_spec()).connect()


def test_camera_config_errors_name_key_value_and_allowed():
    with pytest.raises(
        SpecError,
        match=r"components.cams/wrist.config: color_mode: 'gray' is not a colour mode; allowed: \['rgb', 'bgr'\]",
    ):
        make_robot(camera_spec(color_mode="gray"))
    with pytest.raises(SpecError, match=r"rotation: 45 is not a rotation; allowed: \[0, 90, 180, -90\]"):
        make_robot(camera_spec(rotation=45))
    with pytest.raises(SpecError, match=r"width: 0 must be a positive integer"):
        make_robot(camera_spec(width=0))
    with pytest.raises(
        SpecError, match=r"type: 'realsense' is not a LeRobot camera type; allowed: \['opencv'\]"
    ):
        make_robot(camera_spec(type="realsense"))


# -- a whole robot: follower + leader + camera -----------------------------------------------------


def test_so101_teleop_spec_builds_connects_polls_reads_and_disconnects(tmp_path):
    write_calibration_file(tmp_path, "so101_follower", SO_MOTORS)
    write_calibration_file(tmp_path, "so101_leader", SO_MOTORS)
    overrides = {
        "devices.follower.config.port": "/dev/ttyFAKE0",
        "devices.follower.config.calibration_dir": str(tmp_path),
        "components.teleop.config.port": "/dev/ttyFAKE1",
        "components.teleop.config.calibration_dir": str(tmp_path),
        "components.cams/wrist.config.index_or_path": 0,
        "components.cams/wrist.config.warmup_s": 0,
        "components.cams/wrist.config.width": 64,
        "components.cams/wrist.config.height": 48,
    }
    robot = make_robot("so101_teleop", overrides)
    feats = robot.features()  # no SDK, port or camera needed
    assert feats["arm"]["joint_pos"].names == tuple(ARM)
    assert feats["teleop"]["joints"].names == tuple(ARM) and feats["teleop"]["joints"].unit == "deg"
    assert feats["cams/wrist"]["rgb"].shape == (48, 64, 3)
    with (
        patch_lerobot_bus("so101_follower") as follower,
        patch_lerobot_bus("so101_leader", start_positions={"shoulder_pan": 3.0, "gripper": 70.0}) as leader,
        patch_lerobot_opencv() as camera,
    ):
        robot.connect()
        assert follower.bus.port == "/dev/ttyFAKE0" and leader.bus.port == "/dev/ttyFAKE1"
        states = robot.tick()
        assert states["teleop"].joints["shoulder_pan"] == 3.0 and states["teleop"].gripper == pytest.approx(
            0.7
        )
        assert leader.bus.calls[-1] == ("sync_read", "Present_Position")
        obs = robot.observe()
        assert obs["cams/wrist/rgb"].shape == (48, 64, 3) and "teleop/joints" not in obs
        target = [states["teleop"].joints[j] for j in robot["arm"].joint_names]
        assert robot["arm"].send(target).tolist() == [3.0, 0.0, 0.0, 0.0, 0.0]
        robot.disconnect()
        assert follower.bus.calls[-1] == ("disconnect", True) and leader.bus.calls[-1] == ("disconnect", True)
        assert camera.capture.calls[-1] == ("release",)


# -- human in the loop with a leader arm ----------------------------------------------------------


def test_leader_joints_drive_joint_delta_envs_and_leave_ee_teleops_alone():
    env = RobotEnv("mock_arm", "reach", action_mode="joint_delta", max_joint_step=0.1, human={})
    try:
        q = env.arm.joint_positions()
        names = env.arm.joint_names
        leader = TeleopState(
            action=np.zeros(3),
            gripper=None,
            intervene=True,
            joints={n: float(v) for n, v in zip(names, q + np.array([0.05, -0.5, 0.0, 0.02]), strict=True)},
        )
        np.testing.assert_allclose(teleop_arm_action(env, leader), [0.5, -1.0, 0.0, 0.2])
        env.last_teleop = {"teleop": leader}
        step = env.intervention(env, np.zeros(4))
        assert step.weight == 1.0
        np.testing.assert_allclose(step.action, [0.5, -1.0, 0.0, 0.2])
        np.testing.assert_allclose(TeleopIntervention()(env, np.zeros(4)), [0.5, -1.0, 0.0, 0.2])
        keyboard = TeleopState(action=np.array([1.0, 0.0, -1.0]), intervene=True)
        np.testing.assert_allclose(teleop_arm_action(env, keyboard), [1.0, 0.0, -1.0])  # as before
        partial = TeleopState(action=np.zeros(3), intervene=True, joints={"base_yaw": 0.0})
        with pytest.raises(SpecError, match=r"do not cover arm 'arm' joints .*missing \['pitch_1'"):
            teleop_arm_action(env, partial)
    finally:
        env.close()

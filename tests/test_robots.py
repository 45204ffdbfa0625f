"""The hardware layer: components, specs, the mock and lerobot drivers, safety, `robot check`.

No hardware, Ray or GPU: the mock driver is pure numpy, and the lerobot driver runs
LeRobot's own robot classes over a recording fake motor bus (patched where LeRobot imports it).
"""

from __future__ import annotations

import sys
import textwrap
import time

import numpy as np
import pytest
import yaml
from rlinf_nb.robots import (
    AlreadyConnectedError,
    CalibrationRequiredError,
    DriverUnavailableError,
    EStopLatchedError,
    NotConnectedError,
    RealClock,
    SafeArm,
    SafetyConfig,
    SimClock,
    SpecError,
    check_robot,
    make_robot,
    packaged_specs,
    register_driver,
)
from rlinf_nb.robots import registry as registry_mod
from rlinf_nb.robots.drivers.mock import MockArm, MockArmConfig
from rlinf_nb.robots.kinematics import box_violation

from tests.helpers import run_cli

SO_MOTORS = ["shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper"]


def _spec_path(name: str):
    from rlinf_nb.robots.spec import SPECS_DIR

    return SPECS_DIR / f"{name}.yaml"


def safe_mock_arm(clock=None, **safety) -> SafeArm:
    arm = SafeArm(MockArm(MockArmConfig()), SafetyConfig(**safety), clock or SimClock())
    arm.path = "arm"
    arm.connect()
    return arm


# -- components, robots, specs -----------------------------------------------------------------


def test_packaged_specs_build_and_features_readable_while_disconnected():
    assert {"mock_arm", "mock_bimanual", "so100", "so101", "koch"} <= set(packaged_specs())
    robot = make_robot("mock_arm")
    feats = robot.features()
    assert feats["arm"]["joint_pos"].shape == (4,) and feats["arm"]["joint_pos"].unit == "rad"
    assert feats["arm"]["ee_pos"].unit == "m"
    assert feats["cams/front"]["rgb"].shape == (64, 64, 3) and feats["cams/front"]["rgb"].dtype == "uint8"
    assert set(feats["scene"]) >= {"puck", "hole", "peg"}
    # lerobot features need neither LeRobot's SDK nor a port
    so = make_robot("so101").features()
    assert so["arm"]["joint_pos"].names == tuple(SO_MOTORS[:5]) and so["arm"]["joint_pos"].unit == "deg"
    with pytest.raises(NotConnectedError, match=r"arm 'arm': cannot read while disconnected"):
        robot.component("arm").read()
    with pytest.raises(NotConnectedError, match="cams/front"):
        robot.component("cams/front").image()


def test_connect_disconnect_context_manager_and_double_connect():
    robot = make_robot("mock_arm")
    with robot:
        assert robot.is_connected
        with pytest.raises(AlreadyConnectedError, match="already connected"):
            robot.component("arm").connect()
    assert not any(c.is_connected for c in robot.components().values())
    robot.disconnect()  # idempotent
    cam = make_robot("mock_arm").component("cams/front")
    with pytest.raises(NotConnectedError):
        cam.image()
    robot2 = make_robot("mock_arm")
    with robot2.component("arm") as arm:  # one component alone
        assert arm.joint_positions().shape == (4,)


def test_paths_tree_and_lookup():
    robot = make_robot("mock_bimanual")
    assert robot.paths[:3] == ["base", "left/arm", "left/gripper"]
    assert set(robot.components("arm")) == {"left/arm", "right/arm"}
    assert set(robot.components(under="left")) == {"left/arm", "left/gripper"}
    assert set(robot.components("camera", under="cams")) == {"cams/front", "cams/wrist"}
    assert robot["right/hand"].kind == "hand"
    assert "cams/\n" in robot.tree() + "\n" and "wrist  [camera, mock]" in robot.tree()
    with pytest.raises(ValueError, match=r"no component at path 'left/hand'; paths: base, left/arm"):
        robot.component("left/hand")
    with pytest.raises(ValueError, match="2 arms"):
        robot.arm()
    assert isinstance(robot.arm("left/arm"), SafeArm)


def test_spec_from_yaml_file_dict_and_overrides(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(
        textwrap.dedent(
            """
            name: mine
            clock: sim
            devices: {w: {driver: mock_world}}
            components:
              left/arm: {kind: arm, driver: mock, device: w, config: {home: [0.1, 0.6, -1.4, -0.8]}}
              cams/top: {kind: camera, driver: mock, device: w, config: {width: 16, height: 12}}
            """
        )
    )
    robot = make_robot(str(path), overrides={"components.cams/top.config.width": 20})
    assert robot.name == "mine" and robot.features()["cams/top"]["rgb"].shape == (12, 20, 3)
    with robot:
        assert robot["left/arm"].joint_positions()[0] == pytest.approx(0.1)
    from_dict = make_robot(yaml.safe_load(path.read_text()))
    assert from_dict.paths == ["left/arm", "cams/top"]


def test_swapping_a_driver_changes_the_spec_only():
    """The same paths with the arm on LeRobot instead of the mock: code addressing 'arm' is unchanged."""
    data = yaml.safe_load(_spec_path("mock_arm").read_text())
    data["devices"]["follower"] = {
        "driver": "lerobot",
        "config": {"type": "so101_follower", "port": "/dev/x"},
    }
    data["components"]["arm"] = {"kind": "arm", "driver": "lerobot", "device": "follower"}
    robot = make_robot(data)
    assert robot.paths == make_robot("mock_arm").paths
    assert robot["arm"].driver_name == "lerobot" and isinstance(robot["arm"], SafeArm)
    assert robot["arm"].joint_names == tuple(SO_MOTORS[:5])


@pytest.mark.parametrize(
    "mutate, message",
    [
        (
            lambda d: d["components"]["arm"].update(driver="nope"),
            r"no driver 'nope' for kind 'arm'; drivers for arm: .*mock",
        ),
        (lambda d: d["components"]["arm"].update(kind="leg"), r"'leg' is not a kind; allowed: .*'arm'"),
        (
            lambda d: d["components"]["arm"].update(config={"links": 3}),
            r"unknown field\(s\) \['links'\]; allowed fields: .*link_lengths",
        ),
        (lambda d: d["components"]["arm"].update(device="nowhere"), r"no device 'nowhere' in 'devices'"),
        (
            lambda d: d["components"]["arm"].update(safety={"max_delta": -1}),
            r"safety.max_delta must be > 0.*got -1",
        ),
        (
            lambda d: d["components"]["arm"].update(safety={"workspace_low": [0, 0, 0]}),
            r"give both workspace_low and workspace_high",
        ),
        (
            lambda d: d["components"]["arm"].update(safety={"joint_limits": [[0, 1]]}),
            r"expected 4 pairs \[low, high\]",
        ),
        (lambda d: d["components"]["cams/front"].pop("device"), r"needs a device with driver 'mock_world'"),
        (lambda d: d["components"]["gripper"].update(safety={}), r"only arms take a safety config"),
        (
            lambda d: d["components"].update({"arm/tip": {"kind": "camera", "driver": "mock"}}),
            r"'arm' is a component, so it cannot also be a folder",
        ),
        (
            lambda d: d["components"].update({"Bad Path": {"kind": "camera", "driver": "mock"}}),
            r"lowercase names joined by '/'",
        ),
        (lambda d: d.update(clock="fast"), r"clock must be 'real' or 'sim', got 'fast'"),
        (lambda d: d.update(extra=1), r"unknown key\(s\) \['extra'\]"),
        (
            lambda d: d["components"]["teleop"].update(config={"script": [{"at": 0, "press": "q"}]}),
            r"unknown key 'q'",
        ),
    ],
)
def test_spec_errors_name_the_field_value_and_fix(mutate, message):
    data = yaml.safe_load(_spec_path("mock_arm").read_text())
    mutate(data)
    with pytest.raises(ValueError, match=message):
        make_robot(data)


def test_unknown_packaged_spec_lists_the_packaged_ones():
    with pytest.raises(SpecError, match=r"no packaged spec 'mock_armm'; packaged specs: .*mock_arm"):
        make_robot("mock_armm")
    with pytest.raises(SpecError, match="workspace_low/high: the 'lerobot' arm has no forward kinematics"):
        make_robot(
            "so101",
            overrides={
                "components.arm.safety.workspace_low": [0, 0, 0],
                "components.arm.safety.workspace_high": [1, 1, 1],
            },
        )


def test_register_driver_decorator_plugs_in_a_new_driver(monkeypatch):
    monkeypatch.setattr(registry_mod, "_DRIVERS", dict(registry_mod._DRIVERS))

    @register_driver("test_double")
    class DoubleHomeArm(MockArm):
        pass

    data = yaml.safe_load(_spec_path("mock_arm").read_text())
    data["components"]["arm"]["driver"] = "test_double"
    robot = make_robot(data)
    assert type(robot["arm"].inner) is DoubleHomeArm and robot["arm"].driver_name == "test_double"


# -- the mock driver -----------------------------------------------------------------------------


def test_mock_kinematics_camera_and_push_are_deterministic():
    a, b = make_robot("mock_arm"), make_robot("mock_arm")
    with a, b:
        ee = a["arm"].ee_position()
        np.testing.assert_allclose(ee, [0.41886, 0.0, 0.19010], atol=1e-5)
        # FK by hand: yaw 0 so y = 0; r and z from the three pitch links
        q = np.array([0.3, 0.5, -1.0, -0.4])
        p = np.cumsum(q[1:])
        r = np.sum(np.array([0.3, 0.25, 0.1]) * np.cos(p))
        z = 0.3 + np.sum(np.array([0.3, 0.25, 0.1]) * np.sin(p))
        np.testing.assert_allclose(a["arm"].forward_kinematics(q), [r * np.cos(0.3), r * np.sin(0.3), z])
        img_a, img_b = a["cams/front"].image(), b["cams/front"].image()
        np.testing.assert_array_equal(img_a, img_b)
        a["arm"].send(a["arm"].joint_positions() + np.array([0.15, 0, 0, 0]))
        assert not np.array_equal(a["cams/front"].image(), img_b)  # the arm moved in the picture
        # drive the end effector low, into the puck: the puck is pushed out of contact
        scene = a["scene"]
        ee = a["arm"].ee_position()
        scene.place("puck", np.array([ee[0] + 0.01, ee[1], 0.02]))
        world = a["arm"].inner.device
        before = scene.position("puck")
        arm = a["arm"]
        for _ in range(30):  # lower the end effector under the puck's top
            q = arm.joint_positions()
            dx = np.array([0.0, 0.0, -0.02])
            arm.send(q + np.linalg.pinv(arm.jacobian(q)) @ dx)
            a.tick()  # let time pass, or the velocity limit allows no motion
            if arm.ee_position()[2] < 0.03:
                break
        after = scene.position("puck")
        gap = np.linalg.norm(after[:2] - arm.ee_position()[:2])
        assert gap >= world.config.puck_radius + world.config.pusher_radius - 1e-9
        assert not np.allclose(after, before)


def test_mock_camera_fault_teleop_keys_base_and_hand():
    data = yaml.safe_load(_spec_path("mock_bimanual").read_text())
    data["components"]["cams/wrist"]["config"]["fault"] = "black"
    robot = make_robot(data)
    with robot:
        assert robot["cams/wrist"].image().max() == 0
        robot["base"].send([0.2, 0.0, 0.5])
        for _ in range(10):
            robot.tick()  # 10 x 50 ms
        pose = robot["base"].read()["pose"]
        assert pose[2] == pytest.approx(0.25, abs=1e-6) and pose[0] > 0.09
        assert robot["right/hand"].send([2.0, 0.5, 0.5, 0.5, -1]).tolist() == [1.0, 0.5, 0.5, 0.5, 0.0]
    with make_robot("mock_arm") as robot:
        teleop = robot["teleop"]
        teleop.press("w")
        teleop.press("f")
        state = teleop.poll()
        assert state.action.tolist() == [1.0, 0.0, -1.0] and not state.intervene
        teleop.release("w")
        teleop.tap("t")
        assert teleop.poll().intervene and teleop.poll().intervene  # a toggle
        with pytest.raises(ValueError, match="unknown key 'x'"):
            teleop.press("x")


# -- safety: one test per rule (each fails without that rule) ---------------------------------------


def test_send_returns_what_was_sent():
    arm = safe_mock_arm(max_delta=0.1)
    sent = arm.send(arm.joint_positions() + 1.0)
    np.testing.assert_array_equal(sent, arm.inner.sent[-1])
    assert arm.last_report.clipped == ("max_delta",)


def test_joint_limits_clip():
    arm = safe_mock_arm(joint_limits=[[-1, 1], [-0.4, 1.0], [-2.6, 0.2], [-2.2, 2.2]])
    q = arm.joint_positions()
    sent = arm.send([5.0, 3.0, q[2], q[3]])
    assert sent[0] == 1.0 and sent[1] == 1.0  # the config's limits, tighter than the driver's
    assert "joint_limits" in arm.last_report.clipped
    sent = arm.send([-9.0, q[1], q[2], 9.0])
    assert sent[0] == -1.0 and sent[3] == 2.2  # the driver's hard limit where the config is wider
    np.testing.assert_array_equal(arm.joint_limits[0], [-1, 1])


def test_max_change_per_step():
    arm = safe_mock_arm(max_delta=[0.1, 0.2, 0.05, 0.05])
    q0 = arm.joint_positions()
    sent = arm.send(q0 + np.array([1.0, -1.0, 0.01, 0.3]))
    np.testing.assert_allclose(sent - q0, [0.1, -0.2, 0.01, 0.05])
    assert arm.last_report.clipped == ("max_delta",)


def test_velocity_limit_uses_time_between_commands():
    clock = SimClock()
    arm = safe_mock_arm(clock, max_velocity=2.0, watchdog_ms=None, first_command_dt=0.05)
    q0 = arm.joint_positions()
    sent = arm.send(q0 + 1.0)  # first command: 2 rad/s x 0.05 s
    np.testing.assert_allclose(sent - q0, 0.1)
    clock.advance(0.01)
    sent2 = arm.send(q0 + 1.0)  # 10 ms later: only 0.02 rad more
    np.testing.assert_allclose(sent2 - sent, 0.02)
    assert arm.last_report.clipped == ("max_velocity",)
    sent3 = arm.send(q0 + 1.0)  # no time passed: no motion
    np.testing.assert_allclose(sent3, sent2)


def test_workspace_box_keeps_the_end_effector_inside():
    low, high = [0.1, -0.3, 0.15], [0.6, 0.3, 0.4]
    arm = safe_mock_arm(workspace_low=low, workspace_high=high)
    q = arm.joint_positions()
    down = q + np.linalg.pinv(arm.jacobian(q)) @ np.array([0.0, 0.0, -0.1])  # would go to z = 0.09
    assert arm.forward_kinematics(down)[2] < 0.1
    arm.send(down)
    ee = arm.ee_position()
    assert box_violation(ee, np.array(low), np.array(high)) < 1e-9
    assert ee[2] == pytest.approx(0.15, abs=2e-3)  # went as far as the floor of the box
    assert arm.last_report.clipped == ("workspace",)
    q = arm.joint_positions()
    inside = q + np.linalg.pinv(arm.jacobian(q)) @ np.array([0.0, 0.0, 0.05])
    np.testing.assert_allclose(arm.send(inside), inside)  # moves that stay inside are untouched
    assert arm.last_report.clipped == ()


def test_watchdog_holds_on_command_silence():
    def run(watchdog_ms):
        data = yaml.safe_load(_spec_path("mock_arm").read_text())
        data["components"]["arm"]["config"] = {"speed": 0.5}  # a slow arm: targets take time
        data["components"]["arm"]["safety"] = {"watchdog_ms": watchdog_ms}
        with make_robot(data) as robot:
            arm = robot["arm"]
            q0 = arm.joint_positions()
            arm.send(q0 + np.array([1.0, 0, 0, 0]))
            for _ in range(40):  # 2 s of silence
                robot.tick(0.05)
            return arm.joint_positions()[0] - q0[0], arm.watchdog_trips

    moved_without, trips_without = run(None)
    moved_with, trips_with = run(300)
    assert moved_without == pytest.approx(1.0)  # kept going to the old target
    assert trips_with == 1 and trips_without == 0
    assert moved_with == pytest.approx(0.5 * 0.3, abs=0.5 * 0.05 + 1e-9)  # held at ~300 ms worth of motion


def test_watchdog_thread_on_a_real_clock():
    arm = safe_mock_arm(RealClock(), watchdog_ms=40)
    try:
        arm.send(arm.joint_positions())
        deadline = time.monotonic() + 2.0
        while arm.watchdog_trips == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert arm.watchdog_trips == 1
    finally:
        arm.disconnect()


def test_estop_latches_until_cleared_explicitly():
    with make_robot("mock_arm") as robot:
        arm, grip = robot["arm"], robot["gripper"]
        q0 = arm.joint_positions()
        robot.estop()
        assert robot.estopped
        for _ in range(5):
            sent = arm.send(q0 + 0.1)
            robot.tick()
            np.testing.assert_array_equal(sent, q0)
            assert arm.last_report.clipped == ("estop",)
        assert grip.send([0.0]).tolist() == [1.0]  # the gripper holds too
        assert robot.estopped  # ticks, sends and time do not clear it
        with pytest.raises(EStopLatchedError, match="clear_estop"):
            arm.teleport(q0)
        robot.clear_estop()
        assert not np.allclose(arm.send(q0 + 0.1), q0)


def test_estop_from_a_teleop_button_stops_a_moving_arm():
    data = yaml.safe_load(_spec_path("mock_arm").read_text())
    data["components"]["arm"]["config"] = {"speed": 1.0}
    data["components"]["teleop"]["config"] = {"script": [{"at": 3, "tap": "space"}]}
    with make_robot(data) as robot:
        arm = robot["arm"]
        arm.send(arm.joint_positions() + np.array([0.15, 0, 0, 0]))
        robot.tick(0.05)  # poll 0
        robot.tick(0.05)  # poll 1
        robot.tick(0.05)  # poll 2
        assert not robot.estopped
        robot.tick(0.05)  # poll 3: space
        assert robot.estopped and robot.estop_latch.reason == "teleop teleop"
        here = arm.joint_positions()
        for _ in range(10):
            robot.tick(0.05)
        np.testing.assert_allclose(arm.joint_positions(), here)  # held, not still travelling
        assert robot.estopped


# -- the lerobot driver over a recording fake bus --------------------------------------------------


def so_spec(tmp_path, robot_type="so101_follower", calibrate=True) -> dict:
    from rlinf_nb.robots.testing import write_calibration_file

    if calibrate:
        write_calibration_file(tmp_path, "test_arm", SO_MOTORS)
    return {
        "name": "so_test",
        "clock": "sim",
        "devices": {
            "follower": {
                "driver": "lerobot",
                "config": {
                    "type": robot_type,
                    "port": "/dev/ttyFAKE0",
                    "id": "test_arm",
                    "calibration_dir": str(tmp_path),
                },
            }
        },
        "components": {
            "arm": {"kind": "arm", "driver": "lerobot", "device": "follower", "safety": {"max_delta": 5.0}},
            "gripper": {"kind": "gripper", "driver": "lerobot", "device": "follower"},
        },
    }


def _so_connect_traffic() -> list[tuple]:
    from lerobot.motors.feetech import OperatingMode

    calls: list[tuple] = [("connect",), ("disable_torque", None), ("configure_motors",)]
    for m in SO_MOTORS:
        calls += [
            ("write", "Operating_Mode", m, OperatingMode.POSITION.value),
            ("write", "P_Coefficient", m, 16),
            ("write", "I_Coefficient", m, 0),
            ("write", "D_Coefficient", m, 32),
        ]
        if m == "gripper":
            calls += [
                ("write", "Max_Torque_Limit", m, 500),
                ("write", "Protection_Current", m, 250),
                ("write", "Overload_Torque", m, 25),
            ]
    return calls + [("enable_torque", None)]


def test_so101_exact_bus_traffic_on_connect_send_and_disconnect(tmp_path):
    from rlinf_nb.robots.testing import patch_lerobot_bus

    with patch_lerobot_bus("so101_follower", start_positions={"gripper": 20.0}) as fake:
        robot = make_robot(so_spec(tmp_path))
        robot.connect()
        bus = fake.bus
        assert bus.port == "/dev/ttyFAKE0"
        assert bus.calls == _so_connect_traffic()
        del bus.calls[:]
        sent = robot["arm"].send([12.0, -3.0, 0.0, 0.0, 0.0])
        assert sent.tolist() == [5.0, -3.0, 0.0, 0.0, 0.0]  # max_delta 5 degrees
        assert bus.calls == [
            ("sync_read", "Present_Position"),
            (
                "sync_write",
                "Goal_Position",
                {
                    "shoulder_pan": 5.0,
                    "shoulder_lift": -3.0,
                    "elbow_flex": 0.0,
                    "wrist_flex": 0.0,
                    "wrist_roll": 0.0,
                },
            ),
        ]
        del bus.calls[:]
        assert robot["gripper"].read()["pos"][0] == pytest.approx(0.2)
        assert robot["gripper"].send([0.5]).tolist() == [0.5]
        assert bus.calls == [
            ("sync_read", "Present_Position"),
            ("sync_write", "Goal_Position", {"gripper": 50.0}),
        ]
        del bus.calls[:]
        robot.estop()
        assert robot["arm"].send([0.0] * 5).tolist() == [5.0, -3.0, 0.0, 0.0, 0.0]  # held
        robot.clear_estop()
        del bus.calls[:]
        robot.disconnect()
        assert bus.calls == [("disconnect", True)]


def test_koch_connect_traffic(tmp_path):
    from lerobot.motors.dynamixel import OperatingMode
    from rlinf_nb.robots.testing import patch_lerobot_bus

    with patch_lerobot_bus("koch_follower") as fake, make_robot(so_spec(tmp_path, "koch_follower")) as robot:
        expected = [("connect",), ("disable_torque", None), ("configure_motors",)]
        expected += [
            ("write", "Operating_Mode", m, OperatingMode.EXTENDED_POSITION.value) for m in SO_MOTORS[:5]
        ]
        expected += [
            ("write", "Operating_Mode", "gripper", OperatingMode.CURRENT_POSITION.value),
            ("write", "Position_P_Gain", "elbow_flex", 1500),
            ("write", "Position_I_Gain", "elbow_flex", 0),
            ("write", "Position_D_Gain", "elbow_flex", 600),
            ("enable_torque", None),
        ]
        assert fake.bus.calls == expected
        assert robot["arm"].joint_unit == "deg"


def test_lerobot_missing_sdk_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "scservo_sdk", None)  # as if `lerobot[feetech]` were not installed
    robot = make_robot(so_spec(tmp_path))
    with pytest.raises(
        DriverUnavailableError, match=r"install it with `uv pip install 'lerobot\[feetech\]'`"
    ):
        robot.connect()
    assert not robot.is_connected


def test_lerobot_missing_port_says_plug_in(tmp_path):
    from rlinf_nb.robots.testing import patch_lerobot_bus

    with patch_lerobot_bus("so101_follower", port_present=False):
        with pytest.raises(
            DriverUnavailableError, match=r"/dev/ttyFAKE0.*plug in the arm's USB cable.*lerobot-find-port"
        ):
            make_robot(so_spec(tmp_path)).connect()


def test_lerobot_calibration_never_prompts(tmp_path):
    from rlinf_nb.robots.testing import patch_lerobot_bus

    with patch_lerobot_bus("so101_follower") as fake:
        with pytest.raises(
            CalibrationRequiredError,
            match=r"lerobot-calibrate --robot.type=so101_follower --robot.port=/dev/ttyFAKE0 --robot.id=test_arm",
        ):
            make_robot(so_spec(tmp_path, calibrate=False)).connect()
        assert fake.bus.calls == []  # nothing reached the motors
    with patch_lerobot_bus("so101_follower", calibrated=False) as fake, make_robot(so_spec(tmp_path)):
        assert ("write_calibration", sorted(SO_MOTORS)) in fake.bus.calls  # the file goes to the motors


def test_check_robot_over_the_fake_bus_is_healthy(tmp_path):
    from rlinf_nb.robots.testing import patch_lerobot_bus

    with patch_lerobot_bus("so101_follower", start_positions={m: 10.0 for m in SO_MOTORS}) as fake:
        report = check_robot(so_spec(tmp_path))
    assert report.ok, report.format()
    writes = [c for c in fake.bus.calls if c[:2] == ("sync_write", "Goal_Position")]
    assert len(writes) >= 10
    assert max(abs(v - 10.0) for c in writes for v in c[2].values()) <= 2.5 + 1e-9  # half of max_delta


# -- robot check -----------------------------------------------------------------------------------


def test_robot_check_cli(tmp_path):
    ok = run_cli("robot", "check", "mock_arm", timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "healthy" in ok.stdout and "FAIL" not in ok.stdout and "cams/front" in ok.stdout
    data = yaml.safe_load(_spec_path("mock_arm").read_text())
    data["components"]["arm"]["config"] = {"fault": "stuck"}
    data["components"]["cams/front"]["config"]["fault"] = "black"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    proc = run_cli("robot", "check", str(bad), timeout=120)
    assert proc.returncode == 1
    assert "FAIL  arm" in proc.stdout and "did not move" in proc.stdout
    assert "FAIL  cams/front" in proc.stdout and "flat colour" in proc.stdout
    proc = run_cli(
        "robot", "check", "so101", "--set", "devices.follower.config.port=/dev/ttyNOPE", timeout=120
    )
    assert proc.returncode == 1 and "lerobot[feetech]" in proc.stdout


def test_check_robot_reports_spec_errors():
    report = check_robot({"name": "x", "components": {"arm": {"kind": "arm", "driver": "nope"}}})
    assert not report.ok and report.items[0].path == "spec" and "no driver 'nope'" in report.items[0].message


def test_real_clock_tick_keeps_the_control_rate():
    with make_robot("mock_arm", clock=RealClock()) as robot:  # 20 Hz
        robot.tick()
        start = time.monotonic()
        for _ in range(4):
            time.sleep(0.02)  # work inside the period does not stretch it
            robot.tick()
        assert 0.19 <= time.monotonic() - start < 0.3

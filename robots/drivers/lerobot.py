"""The ``lerobot`` driver: SO-100/SO-101 and Koch followers through LeRobot's own robot classes.

One LeRobot robot object is one :class:`LeRobotFollower` device; its arm joints and its
gripper are two components on it::

    devices:
      follower: {driver: lerobot, config: {type: so101_follower, port: /dev/ttyACM0, id: my_arm}}
    components:
      arm:     {kind: arm, driver: lerobot, device: follower, safety: {max_delta: 5.0}}
      gripper: {kind: gripper, driver: lerobot, device: follower}

LeRobot is imported on connect only. Calibration is never run here (LeRobot's
``calibrate()`` blocks on ``input()``): without a calibration file connecting fails
with the ``lerobot-calibrate`` command to run; with one whose values differ from the
motors', the file is written to the motors (what LeRobot's prompt does on ENTER).
A missing SDK or port raises :class:`DriverUnavailableError` saying what to install or plug in.

The same driver name serves LeRobot's teleoperators (leader arms, keyboard, gamepad:
:mod:`~rlinf_nb.robots.drivers.lerobot_teleop`) and cameras (OpenCV:
:mod:`~rlinf_nb.robots.drivers.lerobot_camera`), which share the helpers here.
"""

from __future__ import annotations

import importlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rlinf_nb.robots.components import Arm, Device, Gripper
from rlinf_nb.robots.errors import CalibrationRequiredError, DriverUnavailableError, SpecError
from rlinf_nb.robots.registry import register_device, register_driver

ARM_JOINTS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll")


@dataclass(frozen=True)
class LeRobotModel:
    """Where LeRobot keeps one arm model (a follower robot or a leader teleoperator), and what its bus needs."""

    module: str
    """Module that defines the LeRobot class (and imports the motor bus class)."""
    class_name: str
    """LeRobot robot or teleoperator class name."""
    config_class: str
    """LeRobot config class name (in the package ``module`` lives in)."""
    bus_class: str
    """Motor bus class name as imported in ``module`` (what tests patch)."""
    sdk_module: str
    """Python module of the vendor SDK the bus needs."""
    extra: str
    """LeRobot extra that installs that SDK."""
    joints: tuple[str, ...] = ARM_JOINTS
    """Arm motors (in order), the gripper excluded."""
    gripper: str = "gripper"
    """Gripper motor name."""
    takes_use_degrees: bool = True
    """Whether the LeRobot config has ``use_degrees`` (the Koch leader has not: it reads -100..100)."""

    @property
    def config_module(self) -> str:
        return self.module.rsplit(".", 1)[0]


def import_lerobot(name: str, missing: dict[str, str] | None = None) -> Any:
    """``importlib.import_module(name)``; a missing module says how to install it.

    ``missing`` maps a dependency's module name (``cv2``) to the message for it; any other
    missing module means LeRobot itself is missing (or broken).
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if missing and exc.name in missing:
            raise DriverUnavailableError(missing[exc.name]) from exc
        raise DriverUnavailableError(
            f"lerobot driver: cannot import {name} ({exc}); install LeRobot with `uv pip install lerobot==0.4.4`"
        ) from exc


def build_lerobot(model: LeRobotModel, type_name: str, kwargs: dict[str, Any]) -> Any:
    """The (unconnected) LeRobot object of ``model``; a missing vendor SDK says which extra to install."""
    module = import_lerobot(model.module)
    config_cls = getattr(import_lerobot(model.config_module), model.config_class)
    try:
        return getattr(module, model.class_name)(config_cls(**kwargs))
    except ModuleNotFoundError as exc:
        if exc.name == model.sdk_module:
            raise DriverUnavailableError(
                f"lerobot driver: the {type_name} motor bus needs the {model.extra} SDK (Python module "
                f"{model.sdk_module!r}, not installed); install it with `uv pip install 'lerobot[{model.extra}]'`"
            ) from exc
        raise


def connect_calibrated(obj: Any, role: str, type_name: str, port: str, id: str) -> None:
    """Connect a LeRobot robot (``role="robot"``) or teleoperator (``"teleop"``) without ever prompting.

    No calibration file: CalibrationRequiredError with the ``lerobot-calibrate`` command. A file whose
    values differ from the motors': written to the motors (LeRobot's answer to ENTER at its prompt).
    """
    if not obj.calibration:
        raise CalibrationRequiredError(
            f"lerobot driver: no calibration file {obj.calibration_fpath} for {type_name} id {id!r}; "
            f"calibrate once with `lerobot-calibrate --{role}.type={type_name} --{role}.port={port} "
            f"--{role}.id={id}` (interactive), then connect again"
        )
    try:
        obj.connect(calibrate=False)
    except ConnectionError as exc:
        if not os.path.exists(port):
            hint = "no such device: plug in the arm's USB cable (and power), or fix the port"
        else:
            hint = "the port exists but the motors did not answer: check the power supply and the bus cable"
        raise DriverUnavailableError(
            f"lerobot driver: cannot open {type_name} on {port!r}: {hint}; list ports with `lerobot-find-port`"
        ) from exc
    if not obj.is_calibrated:
        obj.bus.write_calibration(obj.calibration)


FOLLOWERS: dict[str, LeRobotModel] = {
    "so100_follower": LeRobotModel(
        "lerobot.robots.so_follower.so_follower",
        "SO100Follower",
        "SO100FollowerConfig",
        "FeetechMotorsBus",
        "scservo_sdk",
        "feetech",
    ),
    "so101_follower": LeRobotModel(
        "lerobot.robots.so_follower.so_follower",
        "SO101Follower",
        "SO101FollowerConfig",
        "FeetechMotorsBus",
        "scservo_sdk",
        "feetech",
    ),
    "koch_follower": LeRobotModel(
        "lerobot.robots.koch_follower.koch_follower",
        "KochFollower",
        "KochFollowerConfig",
        "DynamixelMotorsBus",
        "dynamixel_sdk",
        "dynamixel",
    ),
}


@dataclass
class LeRobotFollowerConfig:
    """One LeRobot follower arm on one serial port."""

    type: str
    """LeRobot robot type: ``so100_follower``, ``so101_follower`` or ``koch_follower``."""
    port: str
    """Serial port of the motor bus, e.g. ``/dev/ttyACM0`` (find it with ``lerobot-find-port``)."""
    id: str = "follower"
    """LeRobot robot id: names the calibration file ``<calibration_dir>/<id>.json``."""
    calibration_dir: str | None = None
    """Folder of calibration files; None: LeRobot's default (``~/.cache/huggingface/lerobot/calibration/robots/<name>``)."""
    use_degrees: bool = True
    """Joint positions in degrees (True) or LeRobot's -100..100 range (False)."""
    disable_torque_on_disconnect: bool = True
    """Let the motors go limp on disconnect (LeRobot's default). Put the arm in a rest pose first."""
    max_relative_target: float | None = None
    """LeRobot's own per-step cap (re-reads the motors each send); our SafeArm already caps per step."""

    def __post_init__(self) -> None:
        if self.type not in FOLLOWERS:
            raise SpecError(f"type: {self.type!r} is not supported; allowed: {sorted(FOLLOWERS)}")
        if not self.port:
            raise SpecError(
                "port: give the serial port, e.g. /dev/ttyACM0 (find it with `lerobot-find-port`)"
            )

    @property
    def model(self) -> LeRobotModel:
        return FOLLOWERS[self.type]


@register_device("lerobot")
class LeRobotFollower(Device):
    """A LeRobot follower robot object, opened by the first component that connects."""

    config_class = LeRobotFollowerConfig

    def __init__(self, config: LeRobotFollowerConfig):
        super().__init__(config)
        self.robot: Any = None  # the LeRobot robot while open
        # one serial bus, used by the arm, the gripper and the arm's watchdog thread
        self._lock = threading.RLock()

    def make_lerobot_robot(self) -> Any:
        """The LeRobot robot object for this config (not connected)."""
        cfg: LeRobotFollowerConfig = self.config
        kwargs: dict[str, Any] = {
            "port": cfg.port,
            "id": cfg.id,
            "use_degrees": cfg.use_degrees,
            "disable_torque_on_disconnect": cfg.disable_torque_on_disconnect,
            "max_relative_target": cfg.max_relative_target,
        }
        if cfg.calibration_dir is not None:
            kwargs["calibration_dir"] = Path(cfg.calibration_dir).expanduser()
        return build_lerobot(cfg.model, cfg.type, kwargs)

    def open(self) -> None:
        cfg: LeRobotFollowerConfig = self.config
        robot = self.make_lerobot_robot()
        connect_calibrated(robot, "robot", cfg.type, cfg.port, cfg.id)
        self.robot = robot

    def close(self) -> None:
        robot, self.robot = self.robot, None
        if robot is not None and robot.is_connected:
            robot.disconnect()

    def read_positions(self) -> dict[str, float]:
        with self._lock:
            obs = self.robot.get_observation()
        return {k.removesuffix(".pos"): float(v) for k, v in obs.items() if k.endswith(".pos")}

    def send_positions(self, goal: dict[str, float]) -> dict[str, float]:
        with self._lock:
            sent = self.robot.send_action({f"{k}.pos": float(v) for k, v in goal.items()})
        return {k.removesuffix(".pos"): float(v) for k, v in sent.items()}


class _OnFollower:
    device_class = LeRobotFollower
    device: LeRobotFollower

    @property
    def model(self) -> LeRobotModel:
        return self.device.config.model


@register_driver("lerobot")
class LeRobotArm(_OnFollower, Arm):
    """The arm joints of a LeRobot follower (degrees by default); no kinematics yet."""

    @property
    def joint_unit(self) -> str:  # type: ignore[override]
        return "deg" if self.device.config.use_degrees else "1"

    @property
    def joint_names(self) -> tuple[str, ...]:
        return self.model.joints

    @property
    def joint_limits(self) -> np.ndarray:
        bound = 180.0 if self.device.config.use_degrees else 100.0
        return np.tile([-bound, bound], (len(self.model.joints), 1)).astype(np.float64)

    def _read(self) -> dict[str, np.ndarray]:
        pos = self.device.read_positions()
        return {"joint_pos": np.array([pos[j] for j in self.model.joints], dtype=np.float32)}

    def joint_positions(self) -> np.ndarray:
        self._require_connected("read")
        pos = self.device.read_positions()
        return np.array([pos[j] for j in self.model.joints], dtype=np.float64)

    def _send(self, action: np.ndarray) -> np.ndarray:
        sent = self.device.send_positions(dict(zip(self.model.joints, action.tolist(), strict=True)))
        return np.array([sent[j] for j in self.model.joints], dtype=np.float64)


@register_driver("lerobot")
class LeRobotGripper(_OnFollower, Gripper):
    """The gripper motor of a LeRobot follower; our [0, 1] is LeRobot's 0..100."""

    def _read(self) -> dict[str, np.ndarray]:
        return {"pos": np.array([self.device.read_positions()[self.model.gripper] / 100.0], dtype=np.float32)}

    def _send(self, action: np.ndarray) -> np.ndarray:
        sent = self.device.send_positions({self.model.gripper: float(action[0]) * 100.0})
        return np.array([sent[self.model.gripper] / 100.0])


__all__ = [
    "FOLLOWERS",
    "LeRobotArm",
    "LeRobotFollower",
    "LeRobotFollowerConfig",
    "LeRobotGripper",
    "LeRobotModel",
    "build_lerobot",
    "connect_calibrated",
    "import_lerobot",
]

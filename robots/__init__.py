"""The lego-like hardware layer: components, robots composed by path, drivers, safety.

    from rlinf_nb.robots import make_robot
    with make_robot("mock_arm") as robot:
        arm = robot.component("arm")             # every arm is a SafeArm
        sent = arm.send(arm.joint_positions() + 0.1)
        frame = robot.component("cams/front").image()

Robots never import the runtime; LeRobot is imported only when a lerobot component connects.
"""

from rlinf_nb.robots.check import CheckReport, check_robot
from rlinf_nb.robots.clock import Clock, RealClock, SimClock
from rlinf_nb.robots.components import (
    Actuator,
    Arm,
    Camera,
    Component,
    Device,
    Feature,
    Gripper,
    Hand,
    MobileBase,
    Scene,
    Teleop,
    TeleopState,
)
from rlinf_nb.robots.errors import (
    AlreadyConnectedError,
    CalibrationRequiredError,
    DriverUnavailableError,
    EStopLatchedError,
    NotConnectedError,
    RobotError,
    SpecError,
)
from rlinf_nb.robots.registry import drivers, register_device, register_driver
from rlinf_nb.robots.robot import Robot, make_robot
from rlinf_nb.robots.safety import EStop, SafeArm, SafetyConfig, SafetyReport
from rlinf_nb.robots.spec import RobotSpec, load_spec, packaged_specs

__all__ = [
    "Actuator",
    "AlreadyConnectedError",
    "Arm",
    "CalibrationRequiredError",
    "Camera",
    "CheckReport",
    "Clock",
    "Component",
    "Device",
    "DriverUnavailableError",
    "EStop",
    "EStopLatchedError",
    "Feature",
    "Gripper",
    "Hand",
    "MobileBase",
    "NotConnectedError",
    "RealClock",
    "Robot",
    "RobotError",
    "RobotSpec",
    "SafeArm",
    "SafetyConfig",
    "SafetyReport",
    "Scene",
    "SimClock",
    "SpecError",
    "Teleop",
    "TeleopState",
    "check_robot",
    "drivers",
    "load_spec",
    "make_robot",
    "packaged_specs",
    "register_device",
    "register_driver",
]

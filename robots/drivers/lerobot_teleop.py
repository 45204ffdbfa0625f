"""``lerobot`` teleop devices: leader arms, the keyboard and gamepads through LeRobot's own teleoperators.

One driver serves ``kind: teleop, driver: lerobot``; the config's ``type`` picks the device::

    teleop: {kind: teleop, driver: lerobot, config: {type: so101_leader, port: /dev/ttyACM1, id: my_leader}}
    teleop: {kind: teleop, driver: lerobot, config: {type: keyboard}}
    teleop: {kind: teleop, driver: lerobot, config: {type: gamepad}}

Each maps LeRobot's ``get_action()`` to a :class:`~rlinf_nb.robots.components.TeleopState`:

- **Leader arms** (``so100_leader``, ``so101_leader``, ``koch_leader``) give joint positions, not
  end-effector motion: ``TeleopState.joints`` (arm joints by name, the follower's units) and
  ``gripper`` (LeRobot's 0..100 as 0..1); ``action`` is zero. ``intervene`` is the config's
  ``intervene`` (a leader has no take-over button). In ``joint_delta`` envs the human in the loop
  steps the follower toward the leader (:func:`rlinf_nb.envs.human.teleop_arm_action`).
  Calibration is never run here, as for followers.
- **Keyboard** (LeRobot's ``KeyboardTeleop``, pynput): the mock teleop's keys: w/s a/d r/f move
  x/y/z, t toggles take-over, o/c open/close the gripper, y/n mark success/failure, and x e-stops
  (the mock's space is a key without a character, which LeRobot's keyboard drops; x is LeRobot's
  own rover e-stop key). ESC, on which LeRobot stops its listener, reads as the e-stop.
- **Gamepad** (LeRobot's ``GamepadTeleop``, pygame; hidapi on macOS), LeRobot's mapping: the left
  stick moves x/y and the right stick z, button 5 (RB) held takes over, buttons 7 / 6 open / close
  the gripper, Y/Triangle marks success, A/Cross failure, X/Square ``rerecord``; and our
  ``estop_button`` (B/Circle, LeRobot's "exit", which it leaves unmapped) e-stops.

A missing SDK, display, gamepad or port raises DriverUnavailableError saying what to install or
plug in.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from rlinf_nb.robots.components import Device, Feature, Teleop, TeleopState
from rlinf_nb.robots.drivers.lerobot import (
    LeRobotModel,
    build_lerobot,
    connect_calibrated,
    import_lerobot,
)
from rlinf_nb.robots.drivers.mock import BUTTONS as MOCK_BUTTONS
from rlinf_nb.robots.drivers.mock import KEYMAP as MOCK_KEYMAP
from rlinf_nb.robots.errors import DriverUnavailableError, SpecError
from rlinf_nb.robots.registry import register_driver

LEADERS: dict[str, LeRobotModel] = {
    "so100_leader": LeRobotModel(
        "lerobot.teleoperators.so_leader.so_leader",
        "SO100Leader",
        "SO100LeaderConfig",
        "FeetechMotorsBus",
        "scservo_sdk",
        "feetech",
    ),
    "so101_leader": LeRobotModel(
        "lerobot.teleoperators.so_leader.so_leader",
        "SO101Leader",
        "SO101LeaderConfig",
        "FeetechMotorsBus",
        "scservo_sdk",
        "feetech",
    ),
    "koch_leader": LeRobotModel(
        "lerobot.teleoperators.koch_leader.koch_leader",
        "KochLeader",
        "KochLeaderConfig",
        "DynamixelMotorsBus",
        "dynamixel_sdk",
        "dynamixel",
        takes_use_degrees=False,
    ),
}
INPUT_DEVICES = ("keyboard", "gamepad")
TELEOP_TYPES = (*sorted(LEADERS), *INPUT_DEVICES)

#: keyboard: key -> (axis, sign), as the mock teleop
KEYBOARD_MOTION = dict(MOCK_KEYMAP)
#: keyboard: key -> button name, as the mock teleop but x for its space (see the module doc)
KEYBOARD_BUTTONS = {("x" if key == "space" else key): name for key, name in MOCK_BUTTONS.items()}
GAMEPAD_BUTTONS = ("intervene", "estop", "open", "close", "success", "failure", "rerecord")


@dataclass
class LeRobotTeleopConfig:
    """One LeRobot teleoperator: a leader arm, the keyboard or a gamepad."""

    type: str
    """``so100_leader``, ``so101_leader``, ``koch_leader`` (leader arms), ``keyboard`` or ``gamepad``."""
    port: str | None = None
    """Leader arms: serial port of the leader's motor bus, e.g. ``/dev/ttyACM1``; others take none."""
    id: str = "leader"
    """Leader arms: LeRobot teleoperator id, naming the calibration file ``<calibration_dir>/<id>.json``."""
    calibration_dir: str | None = None
    """Folder of calibration files; None: LeRobot's default (``.../calibration/teleoperators/<name>``)."""
    use_degrees: bool = True
    """SO leaders: joints in degrees (True) or -100..100; match the follower's. The Koch leader reads -100..100."""
    intervene: bool = True
    """Leader arms: report ``intervene`` on every poll (the human drives while it is connected); False: never."""
    estop_button: int | None = 2
    """Gamepad: pygame button index that e-stops (2: B/Circle); None: no e-stop button. Not on macOS (hidapi)."""

    def __post_init__(self) -> None:
        if self.type not in TELEOP_TYPES:
            raise SpecError(f"type: {self.type!r} is not a LeRobot teleop; allowed: {list(TELEOP_TYPES)}")
        if self.type in LEADERS and not self.port:
            raise SpecError(
                f"port: a {self.type} needs its serial port, e.g. /dev/ttyACM1 (find it with `lerobot-find-port`)"
            )
        if self.type in INPUT_DEVICES and self.port is not None:
            raise SpecError(f"port: {self.port!r} given, but a {self.type} has no serial port; remove it")
        if self.estop_button is not None and self.estop_button < 0:
            raise SpecError(f"estop_button: {self.estop_button} is not a button index (>= 0) or null")


def _missing(module: str) -> bool:
    """Whether ``module`` cannot be imported (absent, or set to None in sys.modules)."""
    if module in sys.modules:
        return sys.modules[module] is None
    return importlib.util.find_spec(module) is None


def _headless() -> bool:
    return sys.platform.startswith("linux") and not (
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    )


@register_driver("lerobot")
class LeRobotTeleop(Teleop):
    """A LeRobot teleoperator; ``LeRobotTeleop(config)`` builds the variant of ``config.type``."""

    config_class = LeRobotTeleopConfig
    _variants: ClassVar[dict[str, type[LeRobotTeleop]]] = {}

    def __new__(cls, config: LeRobotTeleopConfig | None = None, device: Device | None = None):
        if cls is LeRobotTeleop and config is not None:
            cls = cls._variants["leader" if config.type in LEADERS else config.type]
        return super().__new__(cls)

    def __init__(self, config: LeRobotTeleopConfig, device: Device | None = None):
        super().__init__(config, device)
        self.teleop: Any = None  # LeRobot's teleoperator while connected

    @classmethod
    def variant(cls, name: str):
        """Class decorator: the subclass serves the config types of ``name`` (``leader``, ``keyboard``, ``gamepad``)."""

        def decorator(sub: type[LeRobotTeleop]) -> type[LeRobotTeleop]:
            cls._variants[name] = sub
            return sub

        return decorator

    def _lerobot_kwargs(self) -> dict[str, Any]:
        cfg: LeRobotTeleopConfig = self.config
        return (
            {} if cfg.calibration_dir is None else {"calibration_dir": Path(cfg.calibration_dir).expanduser()}
        )

    def _disconnect(self) -> None:
        teleop, self.teleop = self.teleop, None
        if teleop is not None and teleop.is_connected:
            teleop.disconnect()


@LeRobotTeleop.variant("leader")
class LeRobotLeaderTeleop(LeRobotTeleop):
    """A leader arm: joint targets in ``TeleopState.joints``, gripper in ``gripper``."""

    @property
    def model(self) -> LeRobotModel:
        return LEADERS[self.config.type]

    @property
    def joint_unit(self) -> str:
        return "deg" if self.model.takes_use_degrees and self.config.use_degrees else "1"

    @property
    def features(self) -> dict[str, Feature]:
        joints = self.model.joints
        return {
            **super().features,
            "joints": Feature("joints", (len(joints),), self.joint_unit, names=joints),
            "gripper": Feature("gripper", (1,), "1", low=(0.0,), high=(1.0,)),
        }

    def _connect(self) -> None:
        cfg: LeRobotTeleopConfig = self.config
        kwargs: dict[str, Any] = {"port": cfg.port, "id": cfg.id, **self._lerobot_kwargs()}
        if self.model.takes_use_degrees:
            kwargs["use_degrees"] = cfg.use_degrees
        teleop = build_lerobot(self.model, cfg.type, kwargs)
        connect_calibrated(teleop, "teleop", cfg.type, cfg.port, cfg.id)
        self.teleop = teleop

    def _positions(self) -> dict[str, float]:
        return {k.removesuffix(".pos"): float(v) for k, v in self.teleop.get_action().items()}

    def _poll(self) -> TeleopState:
        pos = self._positions()
        return TeleopState(
            action=np.zeros(3),
            gripper=float(np.clip(pos[self.model.gripper] / 100.0, 0.0, 1.0)),
            intervene=self.config.intervene,
            joints={j: pos[j] for j in self.model.joints},
        )

    def _read(self) -> dict[str, np.ndarray]:
        state = self.poll()
        return {
            "action": np.zeros(3, dtype=np.float32),
            "joints": np.array([state.joints[j] for j in self.model.joints], dtype=np.float32),
            "gripper": np.array([state.gripper], dtype=np.float32),
        }


@LeRobotTeleop.variant("keyboard")
class LeRobotKeyboardTeleop(LeRobotTeleop):
    """The keyboard through LeRobot's ``KeyboardTeleop`` (held character keys), mapped as the mock teleop."""

    def _connect(self) -> None:
        module = import_lerobot("lerobot.teleoperators.keyboard.teleop_keyboard")
        if not module.PYNPUT_AVAILABLE:
            if _missing("pynput"):
                hint = "the keyboard needs pynput (not installed); install it with `uv pip install pynput`"
            elif _headless():
                hint = (
                    "pynput needs a display (DISPLAY is not set): run on the robot computer's desktop "
                    "session or with `ssh -X`, or use the notebook's keyboard pad (intervention panel)"
                )
            else:
                hint = "pynput failed to import (see the log); reinstall it with `uv pip install pynput`"
            raise DriverUnavailableError(f"lerobot driver: {hint}")
        config = module.KeyboardTeleopConfig(**self._lerobot_kwargs())
        teleop = module.KeyboardTeleop(config)
        teleop.connect()
        if not teleop.is_connected:
            raise DriverUnavailableError("lerobot driver: the pynput keyboard listener did not start")
        self.teleop = teleop
        self._intervene = False
        self._last: set[str] = set()

    def _poll(self) -> TeleopState:
        if not self.teleop.is_connected:  # ESC: LeRobot stopped its listener
            buttons = dict.fromkeys(KEYBOARD_BUTTONS.values(), False) | {"estop": True}
            return TeleopState(action=np.zeros(3), estop=True, buttons=buttons)
        held = {k for k in self.teleop.get_action() if isinstance(k, str)}
        if "t" in held and "t" not in self._last:
            self._intervene = not self._intervene
        self._last = held
        action = np.zeros(3)
        for key in held & set(KEYBOARD_MOTION):
            axis, sign = KEYBOARD_MOTION[key]
            action[axis] += sign
        buttons = {name: key in held for key, name in KEYBOARD_BUTTONS.items()}
        return TeleopState(
            action=np.clip(action, -1.0, 1.0),
            gripper=1.0 if buttons["open"] else 0.0 if buttons["close"] else None,
            intervene=self._intervene,
            estop=buttons["estop"],
            buttons=buttons,
        )


@LeRobotTeleop.variant("gamepad")
class LeRobotGamepadTeleop(LeRobotTeleop):
    """A gamepad through LeRobot's ``GamepadTeleop`` (its deltas, gripper command and teleop events)."""

    def _connect(self) -> None:
        sdk = "hid" if sys.platform == "darwin" else "pygame"
        if _missing(sdk):
            raise DriverUnavailableError(
                f"lerobot driver: the gamepad needs {'hidapi' if sdk == 'hid' else 'pygame'} (Python module "
                f"{sdk!r}, not installed); install it with `uv pip install 'lerobot[gamepad]'`"
            )
        if sdk == "pygame" and _headless():
            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame's event queue needs a video driver
        module = import_lerobot("lerobot.teleoperators.gamepad.teleop_gamepad")
        teleop = module.GamepadTeleop(module.GamepadTeleopConfig(use_gripper=True, **self._lerobot_kwargs()))
        teleop.connect()
        if not teleop.gamepad.running:
            teleop.disconnect()
            raise DriverUnavailableError(
                f"lerobot driver: no gamepad found ({sdk} sees none): plug in a gamepad (USB or paired), then connect again"
            )
        self.teleop = teleop

    def _poll(self) -> TeleopState:
        act = self.teleop.get_action()
        events = {getattr(k, "value", k): bool(v) for k, v in self.teleop.get_teleop_events().items()}
        joystick = getattr(self.teleop.gamepad, "joystick", None)
        button = self.config.estop_button
        estop = bool(button is not None and joystick is not None and joystick.get_button(button))
        grip = int(act.get("gripper", 1))  # LeRobot: 0 close, 1 stay, 2 open
        rerecord = events.get("rerecord_episode", False)
        buttons = {
            "intervene": events.get("is_intervention", False),
            "estop": estop,
            "open": grip == 2,
            "close": grip == 0,
            "success": events.get("success", False),
            "failure": events.get("terminate_episode", False) and not rerecord,
            "rerecord": rerecord,
        }
        action = np.array([act["delta_x"], act["delta_y"], act["delta_z"]], dtype=np.float64)
        return TeleopState(
            action=np.clip(action, -1.0, 1.0),
            gripper=1.0 if grip == 2 else 0.0 if grip == 0 else None,
            intervene=buttons["intervene"],
            estop=estop,
            buttons=buttons,
        )


__all__ = [
    "GAMEPAD_BUTTONS",
    "KEYBOARD_BUTTONS",
    "KEYBOARD_MOTION",
    "LEADERS",
    "LeRobotGamepadTeleop",
    "LeRobotKeyboardTeleop",
    "LeRobotLeaderTeleop",
    "LeRobotTeleop",
    "LeRobotTeleopConfig",
]

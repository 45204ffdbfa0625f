"""Fakes for testing robot code without hardware (shipped in the package, like the mock driver).

:func:`patch_lerobot_bus` swaps LeRobot's motor bus class *where the follower module
imports it* for a :class:`FakeMotorsBus` that records every call, so a test can assert
the exact bus traffic of LeRobot's own robot classes::

    with patch_lerobot_bus("so101_follower") as fake:
        with make_robot(spec) as robot:
            robot.component("arm").send(target)
        assert fake.bus.calls[-1] == ("sync_write", "Goal_Position", {...})

The same works for leader arms (``patch_lerobot_bus("so101_leader")``; move the leader with
``fake.bus.positions[...] = ...``). The other devices are faked where LeRobot imports their SDK:
:func:`patch_lerobot_keyboard` (pynput's listener in LeRobot's keyboard module; ``press``/``release``
keys), :func:`patch_lerobot_gamepad` (a fake ``pygame`` module; ``press`` buttons, ``move`` sticks)
and :func:`patch_lerobot_opencv` (``cv2.VideoCapture`` as LeRobot's OpenCV camera module uses it).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
from rlinf_nb.robots.drivers.lerobot import FOLLOWERS
from rlinf_nb.robots.drivers.lerobot_teleop import LEADERS


class FakeMotorsBus:
    """Stands in for LeRobot's ``FeetechMotorsBus`` / ``DynamixelMotorsBus``.

    ``calls`` lists ``(method, *args)`` in order. Positions start at ``start_positions``
    (0 by default) and follow ``Goal_Position`` writes at once (ideal servos).
    """

    # set per patch by patch_lerobot_bus
    port_present: bool = True
    calibrated: bool = True
    start_positions: dict[str, float] = {}

    def __init__(self, port: str, motors: dict[str, Any], calibration: dict | None = None, **kwargs: Any):
        self.port = port
        self.motors = motors
        self.calibration = calibration or {}
        self.calls: list[tuple] = []
        self.positions = {m: float(self.start_positions.get(m, 0.0)) for m in motors}
        self._connected = False

    @property
    def is_connected(self) -> bool:
        return self._connected

    @property
    def is_calibrated(self) -> bool:
        return self.calibrated

    def connect(self, handshake: bool = True) -> None:
        self.calls.append(("connect",))
        if not self.port_present:
            raise ConnectionError(f"\nCould not connect on port '{self.port}'.")
        self._connected = True

    def disconnect(self, disable_torque: bool = True) -> None:
        self.calls.append(("disconnect", disable_torque))
        self._connected = False

    def configure_motors(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("configure_motors",))

    def disable_torque(self, motors: Any = None, num_retry: int = 0) -> None:
        self.calls.append(("disable_torque", motors))

    def enable_torque(self, motors: Any = None, num_retry: int = 0) -> None:
        self.calls.append(("enable_torque", motors))

    @contextlib.contextmanager
    def torque_disabled(self, motors: Any = None) -> Iterator[None]:
        self.disable_torque(motors)
        try:
            yield
        finally:
            self.enable_torque(motors)

    def write(self, data_name: str, motor: str, value: Any, **kwargs: Any) -> None:
        self.calls.append(("write", data_name, motor, value))

    def read(self, data_name: str, motor: str, **kwargs: Any) -> Any:
        self.calls.append(("read", data_name, motor))
        return self.positions[motor]

    def sync_read(self, data_name: str, motors: Any = None, **kwargs: Any) -> dict[str, float]:
        self.calls.append(("sync_read", data_name))
        names = list(self.motors) if motors is None else [motors] if isinstance(motors, str) else list(motors)
        return {m: self.positions[m] for m in names}

    def sync_write(self, data_name: str, values: dict[str, float], **kwargs: Any) -> None:
        self.calls.append(("sync_write", data_name, dict(values)))
        if data_name == "Goal_Position":
            self.positions.update({k: float(v) for k, v in values.items()})

    def write_calibration(self, calibration: dict, cache: bool = True) -> None:
        self.calls.append(("write_calibration", sorted(calibration)))
        self.calibrated = True


@dataclass
class FakeBusHandle:
    """What :func:`patch_lerobot_bus` yields: the fake class and the buses it made."""

    bus_class: type[FakeMotorsBus]
    buses: list[FakeMotorsBus] = field(default_factory=list)

    @property
    def bus(self) -> FakeMotorsBus:
        if not self.buses:
            raise AssertionError("no motor bus was created (the robot never built its LeRobot object)")
        return self.buses[-1]


@contextlib.contextmanager
def patch_lerobot_bus(
    robot_type: str,
    *,
    port_present: bool = True,
    calibrated: bool = True,
    start_positions: dict[str, float] | None = None,
) -> Iterator[FakeBusHandle]:
    """Replace the motor bus class in the LeRobot module of ``robot_type`` (a follower or a leader arm) by a recording fake.

    Args:
        port_present: False makes ``connect`` fail like a missing serial port.
        calibrated: False makes the motors' calibration differ from the file.
        start_positions: motor name -> starting position (normalised units).
    """
    model = FOLLOWERS[robot_type] if robot_type in FOLLOWERS else LEADERS[robot_type]
    module = importlib.import_module(model.module)
    handle = FakeBusHandle(bus_class=FakeMotorsBus)

    class _Bus(FakeMotorsBus):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            handle.buses.append(self)

    _Bus.port_present = port_present
    _Bus.calibrated = calibrated
    _Bus.start_positions = dict(start_positions or {})
    handle.bus_class = _Bus
    with mock.patch.object(module, model.bus_class, _Bus):
        yield handle


def write_calibration_file(calibration_dir: str | Path, robot_id: str, motors: list[str]) -> Path:
    """A LeRobot calibration file (``<dir>/<id>.json``) with full-range values for ``motors``."""
    path = Path(calibration_dir) / f"{robot_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        m: {"id": i + 1, "drive_mode": 0, "homing_offset": 0, "range_min": 0, "range_max": 4095}
        for i, m in enumerate(motors)
    }
    path.write_text(json.dumps(data, indent=2))
    return path


# -- keyboard: pynput's listener as LeRobot's keyboard module imports it ---------------------------


class FakeKey:
    """A pynput special key (``Key.esc``, ``Key.space``): it has no ``char``."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<Key.{self.name}>"


class FakeKeyCode:
    """A pynput character key."""

    def __init__(self, char: str):
        self.char = char

    def __repr__(self) -> str:
        return f"<KeyCode {self.char!r}>"


SPECIAL_KEYS = (
    "esc",
    "space",
    "enter",
    "backspace",
    "up",
    "down",
    "left",
    "right",
    "shift",
    "shift_r",
    "ctrl_l",
    "ctrl_r",
)


class FakeKeyboardListener:
    """Stands in for ``pynput.keyboard.Listener``: keeps the callbacks LeRobot gives it."""

    def __init__(self, on_press: Any = None, on_release: Any = None, **kwargs: Any):
        self.on_press, self.on_release = on_press, on_release
        self.calls: list[str] = []
        self._alive = False

    def start(self) -> None:
        self.calls.append("start")
        self._alive = True

    def stop(self) -> None:
        self.calls.append("stop")
        self._alive = False

    def is_alive(self) -> bool:
        return self._alive

    def join(self, timeout: float | None = None) -> None:
        pass


@dataclass
class FakeKeyboardHandle:
    """What :func:`patch_lerobot_keyboard` yields: the listeners made, and keys to press on the last one."""

    keys: Any
    listeners: list[FakeKeyboardListener] = field(default_factory=list)

    @property
    def listener(self) -> FakeKeyboardListener:
        if not self.listeners:
            raise AssertionError("no keyboard listener was started (the teleop never connected)")
        return self.listeners[-1]

    def _key(self, key: str) -> Any:
        return getattr(self.keys, key) if key in SPECIAL_KEYS else FakeKeyCode(key)

    def press(self, key: str) -> None:
        """Press ``key``: a character (``"w"``) or a special key name (``"esc"``, ``"space"``)."""
        self.listener.on_press(self._key(key))

    def release(self, key: str) -> None:
        self.listener.on_release(self._key(key))


@contextlib.contextmanager
def patch_lerobot_keyboard() -> Iterator[FakeKeyboardHandle]:
    """Give LeRobot's keyboard module a fake ``pynput.keyboard`` (no display, no key grabbing)."""
    module = importlib.import_module("lerobot.teleoperators.keyboard.teleop_keyboard")
    keys = types.SimpleNamespace(**{name: FakeKey(name) for name in SPECIAL_KEYS})
    handle = FakeKeyboardHandle(keys)

    class _Listener(FakeKeyboardListener):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            handle.listeners.append(self)

    fake = types.SimpleNamespace(Listener=_Listener, Key=keys, KeyCode=FakeKeyCode)
    with mock.patch.multiple(module, keyboard=fake, PYNPUT_AVAILABLE=True):
        yield handle


# -- gamepad: a fake pygame module ------------------------------------------------------------------


_ABSENT = object()


class FakeJoystick:
    """A pygame joystick: ``axes`` and ``buttons`` as the test sets them."""

    def __init__(self, index: int):
        self.index = index
        self.axes = [0.0] * 6
        self.buttons = [0] * 12

    def init(self) -> None:
        pass

    def quit(self) -> None:
        pass

    def get_name(self) -> str:
        return "Fake Gamepad"

    def get_axis(self, i: int) -> float:
        return self.axes[i]

    def get_button(self, i: int) -> int:
        return self.buttons[i]


class FakePygame(types.ModuleType):
    """Stands in for ``pygame`` as LeRobot's gamepad uses it: init, joysticks, button events.

    ``calls`` lists what LeRobot called; ``press``/``release`` a button (state and event), ``move`` a stick axis.
    """

    JOYBUTTONDOWN = 1539
    JOYBUTTONUP = 1540

    class error(RuntimeError):  # noqa: N801 - pygame's name
        pass

    def __init__(self, count: int = 1):
        super().__init__("pygame")
        self.count = count
        self.calls: list[tuple] = []
        self.pads: list[FakeJoystick] = []
        self._events: list[types.SimpleNamespace] = []
        self._joystick_init = False
        self.joystick = types.SimpleNamespace(
            init=self._joy_init, quit=self._joy_quit, get_init=lambda: self._joystick_init,
            get_count=lambda: self.count, Joystick=self._make_joystick,
        )  # fmt: skip
        self.event = types.SimpleNamespace(get=self._get_events)

    def init(self) -> tuple[int, int]:
        self.calls.append(("init",))
        return (1, 0)

    def quit(self) -> None:
        self.calls.append(("quit",))

    def _joy_init(self) -> None:
        self.calls.append(("joystick.init",))
        self._joystick_init = True

    def _joy_quit(self) -> None:
        self.calls.append(("joystick.quit",))
        self._joystick_init = False

    def _make_joystick(self, index: int) -> FakeJoystick:
        self.calls.append(("Joystick", index))
        pad = FakeJoystick(index)
        self.pads.append(pad)
        return pad

    def _get_events(self) -> list[types.SimpleNamespace]:
        events, self._events = self._events, []
        return events

    @property
    def pad(self) -> FakeJoystick:
        if not self.pads:
            raise AssertionError("no joystick was opened (the gamepad never connected)")
        return self.pads[-1]

    def press(self, button: int) -> None:
        self.pad.buttons[button] = 1
        self._events.append(types.SimpleNamespace(type=self.JOYBUTTONDOWN, button=button))

    def release(self, button: int) -> None:
        self.pad.buttons[button] = 0
        self._events.append(types.SimpleNamespace(type=self.JOYBUTTONUP, button=button))

    def move(self, axis: int, value: float) -> None:
        self.pad.axes[axis] = value


@contextlib.contextmanager
def patch_lerobot_gamepad(count: int = 1) -> Iterator[FakePygame]:
    """Put a :class:`FakePygame` with ``count`` gamepads where LeRobot's gamepad imports ``pygame``."""
    fake = FakePygame(count)
    saved = sys.modules.get("pygame", _ABSENT)
    sys.modules["pygame"] = fake  # only this key: patch.dict(sys.modules) would unload LeRobot's modules
    try:
        with mock.patch.dict(os.environ):  # the driver may set SDL_VIDEODRIVER
            yield fake
    finally:
        if saved is _ABSENT:
            sys.modules.pop("pygame", None)
        else:
            sys.modules["pygame"] = saved


# -- cameras: cv2.VideoCapture as LeRobot's OpenCV camera module uses it ----------------------------


def _capture_props() -> dict[str, int]:
    import cv2

    return {
        "width": cv2.CAP_PROP_FRAME_WIDTH,
        "height": cv2.CAP_PROP_FRAME_HEIGHT,
        "fps": cv2.CAP_PROP_FPS,
        "fourcc": cv2.CAP_PROP_FOURCC,
    }


class FakeVideoCapture:
    """Stands in for ``cv2.VideoCapture``: records opens, gets, sets and releases (reads are counted).

    Properties are logged by name (``("set", "width", 64.0)``). Frames are BGR ``[height, width, 3]``
    uint8 with blue = frame number % 256, green 100 and red = column % 256 (not one flat colour, so
    ``check_robot`` passes), delivered at the capture's fps.
    """

    # set per patch by patch_lerobot_opencv
    present: bool = True
    sizes: tuple[tuple[int, int], ...] | None = None

    def __init__(self, index_or_path: Any, backend: int = 0):
        self.ids = _capture_props()
        self.names = {v: k for k, v in self.ids.items()}
        self.source = index_or_path
        self.calls: list[tuple] = [("open", index_or_path, int(backend))]
        self.values = {"width": 640.0, "height": 480.0, "fps": 30.0, "fourcc": 0.0}
        self.frames = 0
        self._open = self.present

    def isOpened(self) -> bool:  # noqa: N802 - OpenCV's name
        return self._open

    def release(self) -> None:
        self.calls.append(("release",))
        self._open = False

    def get(self, prop: int) -> float:
        name = self.names.get(prop, prop)
        self.calls.append(("get", name))
        return self.values.get(name, 0.0)

    def set(self, prop: int, value: float) -> bool:
        name = self.names.get(prop, prop)
        self.calls.append(("set", name, value))
        if self.sizes is not None and name in ("width", "height"):
            if int(value) not in {size[name == "height"] for size in self.sizes}:
                return False  # the camera keeps its mode
        self.values[name] = float(value)
        return True

    def read(self) -> tuple[bool, np.ndarray | None]:
        if not self._open:
            return False, None
        time.sleep(min(1.0 / max(self.values["fps"], 1.0), 0.05))
        self.frames += 1
        frame = np.empty((int(self.values["height"]), int(self.values["width"]), 3), dtype=np.uint8)
        frame[..., 0], frame[..., 1] = self.frames % 256, 100
        frame[..., 2] = np.arange(frame.shape[1]) % 256
        return True, frame


@dataclass
class FakeCaptureHandle:
    """What :func:`patch_lerobot_opencv` yields: the captures opened, in order."""

    captures: list[FakeVideoCapture] = field(default_factory=list)

    @property
    def capture(self) -> FakeVideoCapture:
        if not self.captures:
            raise AssertionError("no VideoCapture was opened (the camera never connected)")
        return self.captures[-1]


@contextlib.contextmanager
def patch_lerobot_opencv(
    *, present: bool = True, sizes: list[tuple[int, int]] | None = None
) -> Iterator[FakeCaptureHandle]:
    """Replace ``cv2.VideoCapture`` (as LeRobot's ``camera_opencv`` module sees it) by a recording fake.

    Args:
        present: False makes the capture fail to open, like a missing camera.
        sizes: ``(width, height)`` modes the camera takes; None: any.
    """
    module = importlib.import_module("lerobot.cameras.opencv.camera_opencv")
    cv2 = module.cv2
    handle = FakeCaptureHandle()

    class _Capture(FakeVideoCapture):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            handle.captures.append(self)

    _Capture.present = present
    _Capture.sizes = None if sizes is None else tuple((int(w), int(h)) for w, h in sizes)
    with mock.patch.object(cv2, "VideoCapture", _Capture):
        yield handle


__all__ = [
    "FakeBusHandle",
    "FakeCaptureHandle",
    "FakeJoystick",
    "FakeKeyboardHandle",
    "FakeKeyboardListener",
    "FakeMotorsBus",
    "FakePygame",
    "FakeVideoCapture",
    "patch_lerobot_bus",
    "patch_lerobot_gamepad",
    "patch_lerobot_keyboard",
    "patch_lerobot_opencv",
    "write_calibration_file",
]

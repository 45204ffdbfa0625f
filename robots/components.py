"""Component base classes: the lego bricks a :class:`~rlinf_nb.robots.robot.Robot` is built from.

A component declares its ``features`` (names, shapes, units, bounds) from its config
alone, so they can be read while disconnected (to size spaces, plan datasets, draw
panels). Reading or commanding needs ``connect()`` (or ``with component:``).

Drivers subclass a kind (``Arm``, ``Gripper``, ...) and implement the underscored
hooks (``_connect``, ``_read``, ``_send``...). The public methods around them do the
connection checks, shape checks and bookkeeping once, for every driver.

Components that share hardware (an SO-101's arm and gripper sit on one motor bus; a
mock arm and its camera share one mock world) share a :class:`Device`, opened by the
first component that connects and closed by the last that disconnects.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from rlinf_nb.robots.errors import AlreadyConnectedError, NotConnectedError
from rlinf_nb.robots.kinematics import numeric_jacobian


@dataclass(frozen=True)
class Feature:
    """One named array a component reads or accepts."""

    name: str
    """Key in the component's ``read()`` dict (or ``"action"`` for what ``send`` takes)."""
    shape: tuple[int, ...]
    """Array shape, e.g. ``(6,)`` for six joints or ``(480, 640, 3)`` for an image."""
    unit: str
    """Physical unit: ``"rad"``, ``"deg"``, ``"m"``, ``"m/s"``, ``"rgb"``, ``"1"`` (unitless) ..."""
    dtype: str = "float32"
    """numpy dtype name of the array."""
    low: tuple[float, ...] | None = None
    """Per-element lower bound (flattened), or None when unbounded."""
    high: tuple[float, ...] | None = None
    """Per-element upper bound (flattened), or None when unbounded."""
    names: tuple[str, ...] = ()
    """Per-element names where they exist (joint names, axis names)."""


class Device:
    """Hardware several components share (one motor bus, one mock world), opened by reference count."""

    def __init__(self, config: Any):
        self.config = config
        self.clock: Any = None  # the robot's Clock, set by make_robot
        self._users = 0

    @property
    def is_open(self) -> bool:
        return self._users > 0

    def acquire(self) -> None:
        """Open on first use; every ``acquire`` needs a matching ``release``."""
        if self._users == 0:
            self.open()
        self._users += 1

    def release(self) -> None:
        if self._users == 0:
            return
        self._users -= 1
        if self._users == 0:
            self.close()

    def open(self) -> None:  # pragma: no cover - trivial default
        """Open the hardware (serial port, SDK session, scene)."""

    def close(self) -> None:  # pragma: no cover - trivial default
        """Close the hardware."""

    def advance(self, dt: float) -> None:
        """Let ``dt`` seconds of simulated time pass (mock and sim devices; no-op for real ones)."""


class Component(abc.ABC):
    """Base of every component: features, connection state, context manager."""

    kind: ClassVar[str] = "component"
    driver_name: ClassVar[str] = "?"
    config_class: ClassVar[type | None] = None

    def __init__(self, config: Any = None, device: Device | None = None):
        self.config = config
        self.device = device
        self.path = ""  # set by the Robot that holds it
        self._connected = False

    def __repr__(self) -> str:
        state = "connected" if self._connected else "disconnected"
        return (
            f"<{type(self).__name__} {self.path or '?'} ({self.kind}, driver {self.driver_name!r}, {state})>"
        )

    # -- features ---------------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def features(self) -> dict[str, Feature]:
        """What ``read()`` returns (and ``"action"``: what ``send`` takes), readable while disconnected."""

    # -- connection -------------------------------------------------------------------------
    @property
    def is_connected(self) -> bool:
        return self._connected

    def connect(self) -> None:
        """Open the component (and its shared device). Raises AlreadyConnectedError if open."""
        if self._connected:
            raise AlreadyConnectedError(f"{self._label}: already connected; call disconnect() first")
        if self.device is not None:
            self.device.acquire()
        try:
            self._connect()
        except BaseException:
            if self.device is not None:
                self.device.release()
            raise
        self._connected = True

    def disconnect(self) -> None:
        """Close the component; a no-op when already disconnected (so cleanup paths stay simple)."""
        if not self._connected:
            return
        try:
            self._disconnect()
        finally:
            self._connected = False
            if self.device is not None:
                self.device.release()

    def __enter__(self):
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.disconnect()

    def _connect(self) -> None:  # noqa: B027 - optional hook
        """Driver hook: open the hardware this component alone owns."""

    def _disconnect(self) -> None:  # noqa: B027 - optional hook
        """Driver hook: release it."""

    # -- helpers ----------------------------------------------------------------------------
    @property
    def _label(self) -> str:
        return f"{self.kind} {self.path!r}" if self.path else f"{self.kind} ({self.driver_name})"

    def _require_connected(self, what: str) -> None:
        if not self._connected:
            raise NotConnectedError(
                f"{self._label}: cannot {what} while disconnected; call connect() or use `with robot:`"
            )

    def read(self) -> dict[str, np.ndarray]:
        """Current readings, keyed as in ``features``."""
        self._require_connected("read")
        return self._read()

    @abc.abstractmethod
    def _read(self) -> dict[str, np.ndarray]:
        """Driver hook behind ``read``."""


def _as_vector(value: Any, n: int, label: str) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64).reshape(-1)
    if arr.shape != (n,):
        raise ValueError(f"{label}: expected an action of shape ({n},), got shape {np.shape(value)}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{label}: action must be finite, got {arr.tolist()}")
    return arr


class Actuator(Component):
    """A component that takes commands: ``send(action)`` returns what was actually sent.

    While the robot's e-stop (``estop_latch``, set by the Robot) is engaged, every command
    is replaced by the one that holds the actuator where it is (``_hold_command``).
    """

    action_dim: int = 0
    estop_latch: Any = None  # the Robot's EStop; None for a free-standing component
    _handles_estop: ClassVar[bool] = False  # SafeArm applies the latch itself

    def send(self, action: Any) -> np.ndarray:
        """Command the actuator; returns the command that actually went out."""
        self._require_connected("send")
        command = _as_vector(action, self.action_dim, self._label)
        latch = self.estop_latch
        if latch is not None and latch.engaged and not self._handles_estop:
            command = self._hold_command()
        return np.asarray(self._send(command), dtype=np.float64)

    @abc.abstractmethod
    def _send(self, action: np.ndarray) -> np.ndarray:
        """Driver hook behind ``send``; returns what was sent."""

    @abc.abstractmethod
    def _hold_command(self) -> np.ndarray:
        """The command that keeps the actuator where it is now (zero velocity for a base)."""

    def stop(self) -> None:
        """Bring the actuator to rest now (hold position, zero velocity). Used by the e-stop."""
        if self._connected:
            self._send(self._hold_command())


class Arm(Actuator):
    """A joint-position-controlled arm. ``send(q)`` takes absolute joint targets in the arm's unit."""

    kind = "arm"

    @property
    @abc.abstractmethod
    def joint_names(self) -> tuple[str, ...]: ...

    @property
    @abc.abstractmethod
    def joint_limits(self) -> np.ndarray:
        """``[n, 2]`` hard limits of the driver (lower, upper), in ``joint_unit``."""

    joint_unit: str = "rad"

    @property
    def action_dim(self) -> int:  # type: ignore[override]
        return len(self.joint_names)

    @property
    def features(self) -> dict[str, Feature]:
        lim = self.joint_limits
        n = len(self.joint_names)
        bounds = {
            "low": tuple(float(x) for x in lim[:, 0]),
            "high": tuple(float(x) for x in lim[:, 1]),
            "names": tuple(self.joint_names),
        }
        feats = {
            "joint_pos": Feature("joint_pos", (n,), self.joint_unit, **bounds),
            "action": Feature("action", (n,), self.joint_unit, **bounds),
        }
        if self.has_kinematics:
            feats["ee_pos"] = Feature("ee_pos", (3,), "m", names=("x", "y", "z"))
        return feats

    # -- kinematics (optional) --------------------------------------------------------------
    @property
    def has_kinematics(self) -> bool:
        """Whether ``forward_kinematics`` is available (needed for EE workspace limits and EE control)."""
        return False

    def forward_kinematics(self, q: np.ndarray) -> np.ndarray:
        """End-effector position ``[3]`` (m) for joint positions ``q``."""
        raise NotImplementedError(f"{self._label}: driver {self.driver_name!r} has no forward kinematics")

    def jacobian(self, q: np.ndarray) -> np.ndarray:
        """``[3, n]`` positional Jacobian (numeric by default)."""
        return numeric_jacobian(self.forward_kinematics, np.asarray(q, dtype=np.float64))

    # -- convenience ------------------------------------------------------------------------
    def joint_positions(self) -> np.ndarray:
        return np.asarray(self.read()["joint_pos"], dtype=np.float64)

    def ee_position(self) -> np.ndarray:
        return self.forward_kinematics(self.joint_positions())

    def _hold_command(self) -> np.ndarray:
        return self.joint_positions()

    # -- exact placement (mock and sim only) ------------------------------------------------
    @property
    def can_teleport(self) -> bool:
        """Whether ``teleport`` works (simulated arms only): used by task resets."""
        return False

    def teleport(self, q: np.ndarray) -> None:
        raise NotImplementedError(f"{self._label}: driver {self.driver_name!r} cannot teleport")


class Gripper(Actuator):
    """A parallel gripper: ``send([opening])`` with opening in [0, 1] (0 closed, 1 open)."""

    kind = "gripper"
    action_dim = 1

    @property
    def features(self) -> dict[str, Feature]:
        return {
            "pos": Feature("pos", (1,), "1", low=(0.0,), high=(1.0,)),
            "action": Feature("action", (1,), "1", low=(0.0,), high=(1.0,)),
        }

    def send(self, action: Any) -> np.ndarray:
        return super().send(np.clip(np.asarray(action, dtype=np.float64).reshape(-1), 0.0, 1.0))

    def _hold_command(self) -> np.ndarray:
        return np.asarray(self.read()["pos"], dtype=np.float64)


class Hand(Actuator):
    """A multi-finger hand: ``send(q)`` with one closure per finger joint in [0, 1]."""

    kind = "hand"

    @property
    @abc.abstractmethod
    def finger_names(self) -> tuple[str, ...]: ...

    @property
    def action_dim(self) -> int:  # type: ignore[override]
        return len(self.finger_names)

    @property
    def features(self) -> dict[str, Feature]:
        n = len(self.finger_names)
        bounds = {"low": (0.0,) * n, "high": (1.0,) * n, "names": self.finger_names}
        return {
            "finger_pos": Feature("finger_pos", (n,), "1", **bounds),
            "action": Feature("action", (n,), "1", **bounds),
        }

    def send(self, action: Any) -> np.ndarray:
        return super().send(np.clip(np.asarray(action, dtype=np.float64).reshape(-1), 0.0, 1.0))

    def _hold_command(self) -> np.ndarray:
        return np.asarray(self.read()["finger_pos"], dtype=np.float64)


class MobileBase(Actuator):
    """A planar base: ``send([vx, vy, wz])`` (m/s, m/s, rad/s); reads odometry ``pose`` [x, y, yaw]."""

    kind = "mobile_base"
    action_dim = 3

    @property
    def features(self) -> dict[str, Feature]:
        return {
            "pose": Feature("pose", (3,), "m,m,rad", names=("x", "y", "yaw")),
            "velocity": Feature("velocity", (3,), "m/s,m/s,rad/s", names=("vx", "vy", "wz")),
            "action": Feature("action", (3,), "m/s,m/s,rad/s", names=("vx", "vy", "wz")),
        }

    def _hold_command(self) -> np.ndarray:
        return np.zeros(3)


class Camera(Component):
    """An RGB camera: ``read()["rgb"]`` is an ``[H, W, 3]`` uint8 image."""

    kind = "camera"

    @property
    @abc.abstractmethod
    def image_shape(self) -> tuple[int, int, int]: ...

    @property
    def features(self) -> dict[str, Feature]:
        return {"rgb": Feature("rgb", self.image_shape, "rgb", dtype="uint8", low=(0.0,), high=(255.0,))}

    def image(self) -> np.ndarray:
        return self.read()["rgb"]


@dataclass
class TeleopState:
    """What a teleop device says at one poll."""

    action: np.ndarray
    """Requested end-effector motion, each axis in [-1, 1] (x, y, z)."""
    gripper: float | None = None
    """Requested gripper opening in [0, 1], or None for "no opinion"."""
    intervene: bool = False
    """The human is driving (take-over held / toggled on)."""
    estop: bool = False
    """The e-stop button is pressed (latches the robot's e-stop)."""
    buttons: dict[str, bool] = field(default_factory=dict)
    """Every named button's state (for success/failure marks and the like)."""
    joints: dict[str, float] | None = None
    """A leader arm's joint targets by joint name, in the follower's joint units (degrees, or LeRobot's
    -100..100), gripper excluded (it is ``gripper``); None for end-effector devices (keyboard, gamepad),
    whose request is ``action``. In ``joint_delta`` envs the human's action steps toward these joints."""


class Teleop(Component):
    """A human input device (keyboard, gamepad, leader arm). ``poll()`` returns a :class:`TeleopState`."""

    kind = "teleop"

    @property
    def features(self) -> dict[str, Feature]:
        return {
            "action": Feature("action", (3,), "1", low=(-1.0,) * 3, high=(1.0,) * 3, names=("x", "y", "z"))
        }

    def poll(self) -> TeleopState:
        self._require_connected("poll")
        return self._poll()

    @abc.abstractmethod
    def _poll(self) -> TeleopState: ...

    def _read(self) -> dict[str, np.ndarray]:
        return {"action": np.asarray(self.poll().action, dtype=np.float32)}


class Scene(Component):
    """Object poses in the robot's frame: from a simulator, a mock world, or a tracker.

    Tasks read object positions through it; simulated scenes can also place objects (``place``).
    """

    kind = "scene"

    @property
    @abc.abstractmethod
    def object_names(self) -> tuple[str, ...]: ...

    @property
    def features(self) -> dict[str, Feature]:
        return {name: Feature(name, (3,), "m", names=("x", "y", "z")) for name in self.object_names}

    def position(self, name: str) -> np.ndarray:
        pos = self.read()
        if name not in pos:
            raise ValueError(f"{self._label}: no object {name!r}; objects: {', '.join(self.object_names)}")
        return np.asarray(pos[name], dtype=np.float64)

    @property
    def can_place(self) -> bool:
        return False

    def place(self, name: str, position: np.ndarray) -> None:
        raise NotImplementedError(f"{self._label}: driver {self.driver_name!r} cannot place objects")

    @property
    def addable_objects(self) -> tuple[str, ...]:
        """Objects :meth:`add_objects` can still build into the scene (before it connects)."""
        return ()

    def add_objects(self, names: list[str]) -> None:
        """Build the objects ``names`` (from :attr:`addable_objects`) when the scene connects."""
        raise NotImplementedError(f"{self._label}: driver {self.driver_name!r} cannot add objects")


#: every component kind by its spec name
KINDS: dict[str, type[Component]] = {
    cls.kind: cls for cls in (Arm, Gripper, Hand, MobileBase, Camera, Teleop, Scene)
}

__all__ = [
    "KINDS",
    "Actuator",
    "Arm",
    "Camera",
    "Component",
    "Device",
    "Feature",
    "Gripper",
    "Hand",
    "MobileBase",
    "Scene",
    "Teleop",
    "TeleopState",
]
